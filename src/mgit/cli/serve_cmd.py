"""`mgit serve`: browse a repository in a web browser (read-only), over `mgit.web.app`."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from functools import partial
from pathlib import Path

import click

from mgit.cli.output import out
from mgit.cli.remote_cmd import endpoint_option, profile_option, region_option
from mgit.remotes import OBJECT_STORE_SCHEMES

DEFAULT_PORT = 8808


@click.command()
@click.argument("directory", required=False, metavar="[DIR|URL]")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Any other than the loopback needs a token.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port to listen on (0: any free one).",
)
@click.option(
    "--token",
    envvar="MGIT_SERVE_TOKEN",
    metavar="TOKEN",
    help="Token every request must carry (default off the loopback: a new one, printed once).",
)
@endpoint_option
@region_option
@profile_option
@click.pass_context
def serve(
    ctx: click.Context,
    directory: str | None,
    host: str,
    port: int,
    token: str | None,
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
) -> None:
    """Browse the repository in a web browser: models, a model's versions, card, files and
    tensors, diffs with a heatmap per layer, the test matrix, storage, the lineage graph.
    Read-only; every page has a JSON twin under /api. Nothing is fetched from the internet.

    On 127.0.0.1 no token is asked; on any other address every request needs the token
    (--token, or one made and printed now).

    A remote (s3://bucket/prefix, az://container/prefix, file:///path, or a bare repository's folder) is served
    from a lazy mirror kept under ~/.cache/mgit/mirrors (MGIT_MIRROR_CACHE), brought up to
    date at start and every few seconds while pages are read: only records are fetched, each
    verified, and the objects a page reads (a diff, a model card) when it reads them. Nothing
    of the remote is trusted or written to, its catalog.sqlite included.

    \b
    Examples:
      mgit serve                               # http://127.0.0.1:8808/
      mgit serve models/ --port 9000
      mgit serve --host 0.0.0.0                 # prints a token to open it with
      mgit serve s3://team-models/repo --endpoint-url http://127.0.0.1:9000
    """
    from mgit.repo.location import is_bare, locate
    from mgit.repo.repository import Repo
    from mgit.web.access import is_loopback, new_token

    if directory is not None and directory.startswith(("http://", "https://")):
        raise click.UsageError(
            "remotes are folders, s3://bucket/prefix or az://container/prefix URLs, not web addresses"
        )
    folder: Path | None = None
    url: str | None = None
    refresh: Callable[[], object] | None = None
    if directory is not None and directory.startswith((*OBJECT_STORE_SCHEMES, "file://")):
        url = directory.removeprefix("file://")
    else:
        start = directory if directory is not None else ctx.obj.directory
        folder = locate(Path(start) if start is not None else None)
        if is_bare(folder):  # a remote: what anyone who may push there wrote, catalog.sqlite included
            url = str(folder)
    if url is not None:
        from mgit.sync.mirror import open_mirror, refresh_mirror

        mirror = open_mirror(url, endpoint_url=endpoint_url, region=region, profile=profile)
        repo = mirror.repo
        refresh = partial(refresh_mirror, repo)
        done = "cloned (records only)" if mirror.created else f"up to date ({len(mirror.moved)} models moved)"
        out.print(f"Mirror of {mirror.url} in {repo.root}: {done}")
    else:
        repo = Repo(folder)
    if not is_loopback(host) and not token:
        token = new_token()
    try:
        from mgit.web.app import create_app
        from mgit.web.server import run
    except ImportError as exc:
        raise click.ClickException(
            f"mgit serve needs the web extra ({exc.name} is missing): pip install 'mgit-models[web]'"
        ) from None
    app = create_app(repo, host=host, token=token, refresh=refresh)
    # The socket is bound here, so that the address printed is the one listened on (--port 0).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise click.ClickException(
                f"port {port} of {host} is in use (another mgit serve?): choose another with "
                "--port N, or --port 0 for any free port"
            ) from None
        raise click.ClickException(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    sock.listen(2048)  # connections wait from now on, before the app has started
    shown = f"[{host}]" if ":" in host else host
    address = f"http://{shown}:{sock.getsockname()[1]}/"
    out.print(f"Serving {repo.root} at {address} (read-only; Ctrl-C stops)")
    if token:
        out.print(f"Open {address}?token={token}  (every request needs this token; it is not shown again)")
    run(app, sock)  # Ctrl-C stops it quietly
