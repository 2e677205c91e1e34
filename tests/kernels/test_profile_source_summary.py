"""benchmarks/profile_sparse_decode.py --source-summary on a small ncu ``--page source`` CSV."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.profile_sparse_decode import source_summary  # noqa: E402

CSV = '''"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"
"0x00","        LDG.E.128 R4, desc[UR4][R2.64]","10","9"
"0x10","        LDGSTS.E.BYPASS.128 [R1], desc[UR4][R6.64]","5","5"
"0x20","        DEPBAR.LE SB0, 0x0","15","15"
"0x30","        HGMMA.64x32x16.F32.BF16 R152, gdesc[UR52], R152","10","8"
"0x40","        WARPGROUP.DEPBAR.LE gsb0, 0x0","30","30"
"0x50","        BAR.SYNC.DEFER_BLOCKING 0x0","5","5"
"0x60","        HGMMA.64x256x16.F32.BF16 R24, R152, gdesc[UR4].tnspB, R24","5","5"
"0x70","  @!P2  STG.E.64 desc[UR60][R6.64+0x180], R74","20","20"
'''


def test_source_summary_splits_stalls_by_region_and_counts_wgmma_waits_as_wgmma(tmp_path):
    """A wgmma wait (WARPGROUP.DEPBAR) is not a cp.async wait (DEPBAR.LE SB): the first summary counted it as one."""
    path = tmp_path / "src.csv"
    path.write_text(CSV)
    text = source_summary(path, top=3)
    assert "8 SASS lines, 100 stall samples" in text
    assert "by region: before the first wgmma 30.0%, the wgmma region 50.0%, after the last wgmma 20.0%" in text
    assert ("by instruction: wgmma and its waits 45.0%, global store 20.0%, global load 10.0%, cp.async 20.0%, "
            "barrier 5.0%, shared 0.0%, exp2 0.0%") in text
    assert text.splitlines()[-3:] == ["    2  15.0%          DEPBAR.LE SB0, 0x0",
                                      "    4  30.0%          WARPGROUP.DEPBAR.LE gsb0, 0x0",
                                      "    7  20.0%    @!P2  STG.E.64 desc[UR60][R6.64+0x180], R74"]
