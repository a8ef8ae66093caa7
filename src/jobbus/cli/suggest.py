"""Close matches for a name that was mistyped or given in the wrong place: a command (`jobbus wroker`,
`jobbus retry ID` for `jobbus jobs retry ID`) or a job type that the loaded App has no handler for."""

from __future__ import annotations

from collections.abc import Iterable

import click


def closest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates most like `word`, best first (difflib's ratio of at least 0.6); none when none is."""
    import difflib  # only when a name was not found: the worker's start does not pay for it

    return difflib.get_close_matches(word, list(candidates), n=n)


def one_of(options: list[str]) -> str:
    """`a`, `a or b`, `a, b or c`: backquoted, for "did you mean ...?"."""
    quoted = [f"`{option}`" for option in options]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


class SuggestingGroup(click.Group):
    """A group whose "No such command" says which command was probably meant (exit 64 as any usage error)."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0]
        if not ctx.resilient_parsing and not name.startswith("-") and self.get_command(ctx, name) is None:
            meant = self.suggestions(ctx, name)
            hint = f"; did you mean {one_of(meant)}?" if meant else "."
            ctx.fail(f"No such command {name!r}{hint}")
        return super().resolve_command(ctx, args)

    def suggestions(self, ctx: click.Context, name: str) -> list[str]:
        """Whole command lines (`jobbus jobs retry`) that `name` probably meant."""
        return [f"{ctx.command_path} {match}" for match in closest(name, self.list_commands(ctx))]
