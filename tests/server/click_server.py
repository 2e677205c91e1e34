"""A click front-end to the stand-in server: the command line of a click/typer program (``transformers serve``
style), the serving of ``standin_server.py``.

    python click_server.py --port 30001 [--continuous-batching / --no-continuous-batching]
        [--reasoning on|off|auto] [--cb-block-size N] [--enable-cors / --no-enable-cors] [--host H] [--model-path M]

``--continuous-batching`` makes it faster (the stand-in's ``--enable-fast-path``). An unknown option or a value
outside a choice list is click's own usage error (``Error: No such option``, exit 2), like any click program.
"""

import os
import sys

import click

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import standin_server  # noqa: E402


@click.command()
@click.option("--host", default="127.0.0.1", help="Server listen address.")
@click.option("--port", type=int, required=True, help="Server listen port.")
@click.option("--model-path", default="standin")
@click.option(
    "--continuous-batching/--no-continuous-batching",
    default=False,
    help="Enable continuous batching with paged attention.",
)
@click.option("--reasoning", type=click.Choice(["on", "off", "auto"]), default="auto", help="Reasoning mode.")
@click.option("--cb-block-size", type=int, default=None, help="KV cache block size in tokens.")
@click.option("--enable-cors/--no-enable-cors", default=False, help="Enable permissive CORS.")
@click.option("--tokens-per-second", type=float, default=1000.0)
@click.option("--reject-field", multiple=True, help="Answer HTTP 422 to a request carrying this field.")
def main(
    host, port, model_path, continuous_batching, reasoning, cb_block_size, enable_cors, tokens_per_second, reject_field
):
    del reasoning, cb_block_size, enable_cors
    argv = [
        "--host",
        host,
        "--port",
        str(port),
        "--model-path",
        model_path,
        "--tokens-per-second",
        str(tokens_per_second),
    ]
    argv += ["--enable-fast-path"] if continuous_batching else []
    for f in reject_field:
        argv += ["--reject-field", f]
    sys.argv = [sys.argv[0], *argv]
    standin_server.main()


if __name__ == "__main__":
    main()
