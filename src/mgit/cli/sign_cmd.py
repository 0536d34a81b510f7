"""Signed versions: `mgit sign` (a version signed with signing.key or the ssh-agent),
`mgit verify` (content against id, signatures against the allowed signers, the lineage
link by link) and `mgit config` (the settings they read: mgit.signing.policy)."""

from __future__ import annotations

import click

from mgit.cli.output import err, json_option, out, print_json, short, signatures_text


@click.command()
@click.argument("ref")
@click.option("--key", metavar="PATH", help="The key to sign with (default: signing.key; a .pub signs via ssh-agent).")
@json_option
@click.pass_context
def sign(ctx: click.Context, ref: str, key: str | None, as_json: bool) -> None:
    """Sign a version: an SSH signature over its id (namespace mgit-version), kept beside it.

    Several keys may sign one version (an author, a reviewer); signatures travel with push,
    fetch and clone. `ssh-keygen -Y verify -n mgit-version` accepts them given `<id>` and a
    newline as the message.

    \b
    Examples:
      mgit config signing.key ~/.ssh/id_ed25519
      mgit sign bert-sst2
      mgit sign bert-sst2@3 --key ~/.ssh/reviewer.pub
    """
    result = ctx.obj.repo().sign(ref, key=key)
    if as_json:
        print_json(result.to_json())
        return
    what = "signed" if result.added else "already signed"
    out.print(f"{result.ref} {short(result.id)}: {what} by {result.fingerprint}")


@click.command()
@click.argument("ref")
@click.option("--lineage", is_flag=True, help="Verify every ancestor too; report the first link that fails.")
@click.option(
    "--level",
    type=click.Choice(["signed", "trusted"]),
    default="trusted",
    show_default=True,
    help="signed: any valid signature; trusted: one by an allowed signer (verify.allowed-signers).",
)
@click.option("--objects", is_flag=True, help="Also decode and re-hash every object the version uses.")
@json_option
@click.pass_context
def verify(ctx: click.Context, ref: str, lineage: bool, level: str, objects: bool, as_json: bool) -> None:
    """Check a version: its content against its id, its signatures against the allowed signers.

    Exit code 1 when the version (or, with --lineage, any ancestor) is refused: the error
    names the first one and why.

    \b
    Examples:
      mgit config verify.allowed-signers ~/.config/mgit/allowed_signers
      mgit verify bert-sst2
      mgit verify bert-sst2 --lineage --json
    """
    result = ctx.obj.repo().verify(ref, lineage=lineage, level=level, objects=objects)
    if as_json:
        print_json(result.to_json())
    else:
        for v in result.versions:
            content = "content ok" if v.content_ok else f"CONTENT BAD ({v.problem})"
            out.print(f"{v.ref} {short(v.id)}: {content}; {signatures_text(v.signatures)}")
    if not result.ok:
        if as_json:
            ctx.exit(1)
        result.raise_if_refused()


@click.command()
@click.argument("key", required=False)
@click.argument("value", required=False)
@click.option("--unset", is_flag=True, help="Remove the setting.")
@json_option
@click.pass_context
def config(ctx: click.Context, key: str | None, value: str | None, unset: bool, as_json: bool) -> None:
    """Read or set a repository setting (no KEY: list them).

    \b
    Settings:
      signing.key PATH             a private key, or a .pub the ssh-agent holds
      signing.always true|false    sign every version committed here
      verify.allowed-signers PATH  whose signatures are trusted (ssh-keygen's format)
      verify.revoked PATH          public keys no longer trusted
      verify.require signed|trusted|none   what fetch, pull, clone and checkout demand
      remote.NAME.verify signed|trusted|none   the same, for one remote

    \b
    Examples:
      mgit config signing.key ~/.ssh/id_ed25519
      mgit config verify.require trusted
      mgit config verify.require
      mgit config verify.require --unset
    """
    from mgit.remotes.config import update_config
    from mgit.signing.policy import SETTINGS_KEY, check_setting, settings

    repo = ctx.obj.repo()
    if key is None:
        found = settings(repo.config)
        if as_json:
            print_json(found)
        for k, v in sorted(found.items()) if not as_json else []:
            out.print(f"{k}={str(v).lower() if isinstance(v, bool) else v}")
        return
    if value is None and not unset:
        current = settings(repo.config).get(key)
        if as_json:
            print_json({key: current})
        elif current is None:
            err.print(f"note: {key} is not set")
        else:
            out.print(str(current).lower() if isinstance(current, bool) else str(current))
        return
    stored = None if unset else check_setting(key, value or "")

    def change(cfg: dict) -> None:
        values = dict(cfg.get(SETTINGS_KEY) or {})
        if stored is None:
            values.pop(key, None)
        else:
            values[key] = stored
        cfg[SETTINGS_KEY] = values

    update_config(repo.dir, change)
    if as_json:
        print_json({key: stored})
