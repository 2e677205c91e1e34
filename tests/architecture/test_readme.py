"""The README as a newcomer reads it: the two commands for a fresh machine first, a "Deploy" section with `tuner
verify`, lines of at most 120 characters, no kernel-internal switch names, issue numbers or commit hashes (those live
in benchmarks/results/ and docs/), and every file it links to present."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SWITCHES = ("SPLIT_WG", "SEESAW", "MERGE", "PART16", "P_SMEM", "S_PAD", "V_SPLIT", "STORE_CVT", "WS=1")


def test_the_readme_opens_with_the_main_job_and_the_tests_for_a_fresh_machine():
    block = README.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("pip install torch==2.13.0 && pip install -e . && tuner search --budget 2m  "), block
    assert block[1].startswith("bash scripts/test.sh  "), block


def test_the_readme_says_how_to_deploy_the_export_and_verify_it():
    deploy = README.split("\n## Deploy\n", 1)[1].split("\n## ", 1)[0]
    assert "bash tuner-out/<study>/launch.sh" in deploy and "tuner verify tuner-out/<study>/launch.sh" in deploy


def test_the_readme_keeps_to_120_characters_and_leaves_lab_names_to_the_results():
    long = [(i + 1, len(ln)) for i, ln in enumerate(README.splitlines()) if len(ln) > 120]
    assert not long, long
    text = re.sub(r"\]\([^)]*\)|^\[\w+\]: .*$", "", README, flags=re.M)  # link targets name result files
    assert not [s for s in SWITCHES if s in text]
    assert not re.findall(r"\b(?:issue|PR) #?\d+|#\d{2,}\b", text, re.I)
    assert not re.findall(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text)


def test_every_file_the_readme_links_to_exists():
    targets = re.findall(r"\]\(([^)#]+)\)", README) + re.findall(r"^\[\w+\]: (\S+)$", README, re.M)
    assert len(targets) > 5
    assert not [t for t in targets if not t.startswith("http") and not (ROOT / t).exists()]
