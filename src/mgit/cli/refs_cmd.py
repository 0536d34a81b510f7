"""Names and tags as users move them: `mgit tag` (tags set on a version after it was added)
and `mgit rename` (a model under another name)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from mgit.cli.output import out, print_json

if TYPE_CHECKING:
    from mgit.repo.tagging import TagsResult

json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


def _tag_pair(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    if not key:
        raise click.BadParameter(f"{text!r} has no name before '='", param_hint="NAME[=VALUE]")
    return key, value


def _tags_line(result: TagsResult) -> str:
    tags = " ".join(f"{k}={v}" if v else k for k, v in result.tags.items())
    return f"{result.ref}: {tags or 'no tags'}"


@click.command()
@click.argument("ref")
@click.argument("names", nargs=-1, metavar="[NAME[=VALUE]]...")
@click.option("--delete", "-d", is_flag=True, help="Remove the named tags instead of setting them.")
@json_option
@click.pass_context
def tag(ctx: click.Context, ref: str, names: tuple[str, ...], delete: bool, as_json: bool) -> None:
    """Set tags on a version (NAME alone: an empty value), remove them with -d, or list them.

    Tags set here stay on their version (they do not move to the model's next one), travel with
    push and pull, and are what log --tag and ls --tag select by.

    \b
    Examples:
      mgit tag bert-sst2@3 stage=prod reviewed
      mgit tag -d bert-sst2@3 reviewed
      mgit tag bert-sst2@3 --json
    """
    if delete and not names:
        raise click.UsageError("-d needs the NAMEs of the tags to remove")
    repo = ctx.obj.repo()
    if delete:
        result = repo.tag(ref, delete=[_tag_pair(n)[0] for n in names])
    else:
        result = repo.tag(ref, dict(_tag_pair(n) for n in names))
    if as_json:
        print_json(result.to_json())
        return
    out.print(_tags_line(result))


@click.command()
@click.argument("old")
@click.argument("new")
@json_option
@click.pass_context
def rename(ctx: click.Context, old: str, new: str, as_json: bool) -> None:
    """Give a model another name. Its versions keep their ids and numbers; tests attached to
    exactly OLD follow it; OLD is refused afterwards (until a model is added under it, which
    goes on from OLD's last number). A push sends NEW; see the README for what happens to OLD
    on a remote.

    \b
    Example:
      mgit rename bert-sst2 bert-sst2-v1
    """
    from dataclasses import replace

    repo = ctx.obj.repo()
    result = repo.rename(old, new)
    if (repo.dir / "checks.sqlite").exists():
        from mgit.checks import Checks

        result = replace(result, retargeted_tests=Checks(repo).retarget(old, new))
    if as_json:
        print_json(result.to_json())
        return
    out.print(f"renamed {result.old} to {result.new} (head {result.new}@{result.seq})")
    if result.retargeted_tests:
        out.print(f"  tests now attached to {result.new}: {', '.join(result.retargeted_tests)}")
