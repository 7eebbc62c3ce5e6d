"""`xum completion bash|zsh|fish`: the shell completion script, from click's own machinery.

The script calls `xum` back with `_XUM_COMPLETE=<shell>_complete` set (click's protocol), so
completion always matches the installed commands, the lazily loaded domain ones included.
"""

from __future__ import annotations

import click

SHELLS = ("bash", "zsh", "fish")


def script(cli: click.Command, shell: str) -> str:
    """The completion script for `shell`."""
    from click.shell_completion import get_completion_class

    cls = get_completion_class(shell)
    if cls is None:  # click supports each of SHELLS; a future click might not
        raise click.ClickException(f"no completion for {shell} in this click")
    return cls(cli, {}, "xum", "_XUM_COMPLETE").source()


def register(cli: click.Group) -> None:
    @cli.command("completion")
    @click.argument("shell", type=click.Choice(SHELLS))
    def completion(shell: str) -> None:
        """Print the shell completion script for SHELL.

        \b
        bash:  eval "$(xum completion bash)"     (in ~/.bashrc)
        zsh:   eval "$(xum completion zsh)"      (in ~/.zshrc, after compinit)
        fish:  xum completion fish > ~/.config/fish/completions/xum.fish
        """
        click.echo(script(cli, shell))
