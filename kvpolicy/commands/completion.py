"""``kvpolicy completion bash|zsh|fish``: a shell completion script for kvpolicy.

Commands, their options and the choices of options that have them (``--format``,
``--color``, ``--engine`` ...) complete; file arguments complete as files. Install:

  bash:  kvpolicy completion bash > ~/.local/share/bash-completion/completions/kvpolicy
  zsh:   kvpolicy completion zsh > ~/.zfunc/_kvpolicy   (with fpath+=~/.zfunc before compinit)
  fish:  kvpolicy completion fish > ~/.config/fish/completions/kvpolicy.fish

The script is generated from the command line itself, so it is never out of date with
the version that wrote it. It has no ``--format``: its output is a shell script.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import dataclass

from kvpolicy.commands import Subcommands

SHELLS = ("bash", "zsh", "fish")


def add_parser(sub: Subcommands) -> None:
    parser = sub.add_parser("completion", help="print a shell completion script (bash, zsh, fish)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help=f"one of: {', '.join(SHELLS)}")
    parser.set_defaults(run=run)


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    help: str
    choices: tuple[str, ...]
    takes_value: bool


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    options: tuple[Option, ...]
    positional_choices: tuple[str, ...]


def describe(parser: argparse.ArgumentParser) -> tuple[tuple[Option, ...], tuple[Command, ...]]:
    """The global options and every command with its options, from the parser."""
    from kvpolicy.commands import subcommands

    helps = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
    commands = tuple(
        Command(name, helps.get(name, ""), _options(command),
                tuple(c for a in command._actions if not a.option_strings and a.choices for c in a.choices))
        for name, command in subcommands(parser).items()
    )
    return _options(parser), commands


def _options(parser: argparse.ArgumentParser) -> tuple[Option, ...]:
    return tuple(
        Option(tuple(a.option_strings), (a.help or "").split("\n")[0], tuple(str(c) for c in a.choices or ()), a.nargs != 0)
        for a in parser._actions
        if a.option_strings and a.help != argparse.SUPPRESS
    )


def run(args: argparse.Namespace) -> int:
    from kvpolicy.cli import build_parser

    global_options, commands = describe(build_parser())
    sys.stdout.write({"bash": bash, "zsh": zsh, "fish": fish}[args.shell](global_options, commands))
    return 0


def bash(global_options: tuple[Option, ...], commands: tuple[Command, ...]) -> str:
    cases = []
    for command in commands:
        words = " ".join(f for o in command.options for f in o.flags)
        choices = [f"      {'|'.join(o.flags)}) COMPREPLY=($(compgen -W {shlex.quote(' '.join(o.choices))} -- \"$cur\")); return;;"
                   for o in command.options if o.choices]
        cases.append(
            f"    {command.name})\n      case \"$prev\" in\n" + "\n".join(choices) + ("\n" if choices else "")
            + "      esac\n"
            f"      if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W {shlex.quote(words)} -- \"$cur\"));\n"
            + (f"      else COMPREPLY=($(compgen -W {shlex.quote(' '.join(command.positional_choices))} -- \"$cur\"));\n"
               if command.positional_choices else "      else COMPREPLY=($(compgen -f -- \"$cur\"));\n")
            + "      fi;;"
        )
    names = " ".join(c.name for c in commands)
    flags = " ".join(f for o in global_options for f in o.flags)
    return f"""# bash completion for kvpolicy (kvpolicy completion bash)
_kvpolicy() {{
  local cur prev command i
  cur=${{COMP_WORDS[COMP_CWORD]}}
  prev=${{COMP_WORDS[COMP_CWORD-1]}}
  command=
  for ((i = 1; i < COMP_CWORD; i++)); do
    case ${{COMP_WORDS[i]}} in
      --color) ((i++));;
      -*) ;;
      *) command=${{COMP_WORDS[i]}}; break;;
    esac
  done
  if [[ -z $command ]]; then
    if [[ $prev == --color ]]; then COMPREPLY=($(compgen -W 'auto always never' -- "$cur")); return; fi
    COMPREPLY=($(compgen -W {shlex.quote(names + ' ' + flags)} -- "$cur"))
    return
  fi
  case $command in
{chr(10).join(cases)}
  esac
}}
complete -o filenames -F _kvpolicy kvpolicy
"""


def _zsh_spec(option: Option) -> str:
    text = option.help.replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")
    value = f":value:({' '.join(option.choices)})" if option.choices else (":value:_files" if option.takes_value else "")
    flags = option.flags
    if len(flags) == 1:
        return f"'{flags[0]}[{text}]{value}'"
    return f"'({' '.join(flags)})'{{{','.join(flags)}}}'[{text}]{value}'"


def zsh(global_options: tuple[Option, ...], commands: tuple[Command, ...]) -> str:
    described = "\n".join(f"    '{c.name}:{c.help.replace(chr(39), '').replace(':', chr(92) + ':')}'" for c in commands)
    cases = []
    for command in commands:
        specs = " \\\n        ".join(_zsh_spec(o) for o in command.options)
        positional = f"'*:argument:({' '.join(command.positional_choices)})'" if command.positional_choices else "'*:file:_files'"
        cases.append(f"    {command.name})\n      _arguments -s \\\n        {specs} \\\n        {positional};;")
    globals_ = " \\\n    ".join(_zsh_spec(o) for o in global_options)
    return f"""#compdef kvpolicy
# zsh completion for kvpolicy (kvpolicy completion zsh)
_kvpolicy() {{
  local -a commands
  commands=(
{described}
  )
  local curcontext=$curcontext state line
  _arguments -C \\
    {globals_} \\
    '1:command:->command' \\
    '*::argument:->argument'
  case $state in
    command) _describe -t commands 'kvpolicy command' commands;;
    argument)
      case $line[1] in
{chr(10).join(cases)}
      esac;;
  esac
}}
_kvpolicy "$@"
"""


def fish(global_options: tuple[Option, ...], commands: tuple[Command, ...]) -> str:
    lines = ["# fish completion for kvpolicy (kvpolicy completion fish)", "complete -c kvpolicy -f"]
    names = " ".join(c.name for c in commands)
    for command in commands:
        lines.append(f"complete -c kvpolicy -n 'not __fish_seen_subcommand_from {names}' -a {command.name} "
                     f"-d {shlex.quote(command.help)}")
    for option in global_options:
        lines.append(_fish_option(option, f"not __fish_seen_subcommand_from {names}"))
    for command in commands:
        condition = f"__fish_seen_subcommand_from {command.name}"
        if command.positional_choices:
            lines.append(f"complete -c kvpolicy -n {shlex.quote(condition)} -a {shlex.quote(' '.join(command.positional_choices))}")
        else:
            lines.append(f"complete -c kvpolicy -n {shlex.quote(condition)} -F")
        lines += [_fish_option(o, condition) for o in command.options]
    return "\n".join(lines) + "\n"


def _fish_option(option: Option, condition: str) -> str:
    parts = [f"complete -c kvpolicy -n {shlex.quote(condition)}"]
    for flag in option.flags:
        parts.append(f"-l {flag[2:]}" if flag.startswith("--") else f"-s {flag[1:]}")
    if option.choices:
        parts.append(f"-x -a {shlex.quote(' '.join(option.choices))}")
    elif option.takes_value:
        parts.append("-r -F")
    parts.append(f"-d {shlex.quote(option.help)}")
    return " ".join(parts)
