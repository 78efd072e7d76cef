"""A launch script's commands and their words, read as a POSIX shell (bash) reads them.

Trainers' configs are often shell scripts: Megatron-LM's examples (``examples/gpt3/
train_gpt3_175b_distributed.sh``) assign variables and arrays, break long lines with ``\\``,
comment inside arrays and start ``torchrun ... pretrain_gpt.py ${GPT_MODEL_ARGS[@]}``. Python's
``shlex`` splits words but not commands, and it keeps a backslash-newline as a newline inside a
word, so it cannot read them. This module follows the shell's rules (bash manual, "Shell
Syntax" and "Shell Expansions") for what such scripts use, and no more:

- quoting: ``'...'`` literal, ``"..."`` with ``$`` expansions and ``\\`` before ``$ ` " \\``
  and newline, ``\\c`` outside quotes; a backslash-newline outside single quotes joins lines;
- comments: ``#`` at the start of a word, to the end of the line (not inside quotes or words);
- commands end at a newline, ``;``, ``&``, ``&&``, ``||`` or ``|``; redirections
  (``2>&1``, ``> log``) are dropped with their target;
- assignments ``NAME=value`` (alone, as a command's prefix, after ``export``/``declare``/
  ``local``/``readonly``) and arrays ``NAME=( ... )`` over several lines;
- expansions: ``$NAME``, ``${NAME}``, ``${NAME[@]}``/``${NAME[*]}``, ``${NAME:-default}`` /
  ``${NAME-default}``, and integer arithmetic ``$(( ... ))`` over + - * / % and parentheses;
  unquoted expansions are split on whitespace. A variable the script does not assign, a
  positional parameter (``$1``) and a command substitution (``$(...)``, backquotes) cannot be
  known without running it: the word keeps its text and names them in ``unresolved``.

Control flow (``if``, loops, functions) is not followed: their words are read as commands.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field

from autoplan.errors import ExportError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
SEPARATORS = {"\n", ";", ";;", "&", "&&", "||", "|", "|&"}
DECLARERS = {"export", "declare", "local", "readonly", "typeset"}


@dataclass(frozen=True)
class Segment:
    """A piece of one word: literal text, a parameter, an arithmetic or a command substitution."""

    kind: str  # "lit", "var", "arith", "cmd"
    text: str  # the literal, the parameter's name, the expression, or the substitution's source
    quoted: bool
    raw: str = ""  # the source text of an expansion, kept when it cannot be resolved
    default: str | None = None  # ${NAME:-default}
    index: str | None = None  # "@" or "*" for ${NAME[@]}
    parts: tuple["Segment", ...] = ()  # kind "dq": the pieces of a "..." string holding expansions


@dataclass(frozen=True)
class Word:
    """One shell word after expansion, and the expansions in it the script leaves unknown."""

    text: str
    unresolved: tuple[str, ...] = ()


@dataclass
class Command:
    """One simple command: its expanded words, and the assignments written before it."""

    words: list[Word]
    env: dict[str, str] = field(default_factory=dict)


# ---- lexing: characters to words and operators ------------------------------------------------
class _Lexer:
    """Characters to tokens: a word is a list of :class:`Segment`, an operator a string."""

    def __init__(self, text: str):
        self.text, self.i = text, 0
        self.tokens: list[list[Segment] | str] = []

    def run(self) -> list[list[Segment] | str]:
        word: list[Segment] = []
        while self.i < len(self.text):
            c = self.text[self.i]
            if c == "\\" and self.text.startswith("\n", self.i + 1):
                self.i += 2  # line continuation
            elif c in " \t\r" or c == "\n" or c in ";&|()<>":
                word = self._end_word(word, c)
            elif c == "#" and not word:
                while self.i < len(self.text) and self.text[self.i] != "\n":
                    self.i += 1
            else:
                word.append(self._segment(quoted=False))
        self._flush(word)
        return self.tokens

    def _flush(self, word: list[Segment]) -> None:
        if word:
            self.tokens.append(word)

    def _end_word(self, word: list[Segment], c: str) -> list[Segment]:
        if c in "<>" and _literal(word).isdigit():
            word = []  # a file descriptor: 2>&1
        self._flush(word)
        if c in " \t\r":
            self.i += 1
            return []
        self.tokens.append(self._operator())
        return []

    def _operator(self) -> str:
        for op in ("&&", "||", ";;", "|&", ">>", ">&", "&>", "<<"):
            if self.text.startswith(op, self.i):
                self.i += len(op)
                return op
        self.i += 1
        return self.text[self.i - 1]

    def _segment(self, *, quoted: bool) -> Segment:
        c = self.text[self.i]
        if c == "'":
            end = self._find("'", self.i + 1)
            text, self.i = self.text[self.i + 1 : end], end + 1
            return Segment("lit", text, True)
        if c == '"':
            return self._double_quoted()
        if c == "\\":
            self.i += 2
            return Segment("lit", self.text[self.i - 1 : self.i], True)
        if c in "$`":
            return self._expansion(quoted)
        start = self.i
        while self.i < len(self.text) and self.text[self.i] not in " \t\r\n;&|()<>'\"\\$`":
            self.i += 1
        return Segment("lit", self.text[start : self.i], quoted)

    def _double_quoted(self) -> Segment:
        """A "..." string: one literal, or, if it holds expansions, a "dq" segment of its parts."""
        self.i += 1
        parts: list[Segment] = []
        text = ""
        while self.i < len(self.text) and self.text[self.i] != '"':
            c = self.text[self.i]
            if c == "\\" and self.i + 1 < len(self.text) and self.text[self.i + 1] in '$`"\\\n':
                text += "" if self.text[self.i + 1] == "\n" else self.text[self.i + 1]
                self.i += 2
            elif c in "$`":
                parts += [Segment("lit", text, True)] if text else []
                parts.append(self._expansion(True))
                text = ""
            else:
                text, self.i = text + c, self.i + 1
        if self.i >= len(self.text):
            raise ExportError('the script has a " quote that is never closed.')
        self.i += 1
        parts += [Segment("lit", text, True)] if text or not parts else []
        return parts[0] if len(parts) == 1 else Segment("dq", "", True, parts=tuple(parts))

    def _expansion(self, quoted: bool) -> Segment:
        text, start = self.text, self.i
        if text[start] == "`":
            end = self._find("`", start + 1)
            self.i = end + 1
            return Segment("cmd", text[start + 1 : end], quoted, raw=text[start : self.i])
        if text.startswith("$((", start):
            end = self._closing(start + 1, "(", ")")
            self.i = end + 1
            return Segment("arith", text[start + 3 : end - 1], quoted, raw=text[start : self.i])
        if text.startswith("$(", start):
            end = self._closing(start + 1, "(", ")")
            self.i = end + 1
            return Segment("cmd", text[start + 2 : end], quoted, raw=text[start : self.i])
        if text.startswith("${", start):
            end = self._closing(start + 1, "{", "}")
            self.i = end + 1
            return _braced(text[start + 2 : end], quoted, raw=text[start : self.i])
        match = NAME.match(text, start + 1) or re.compile(r"[0-9@*#?$!-]").match(text, start + 1)
        if match is None:
            self.i += 1
            return Segment("lit", "$", quoted)
        self.i = match.end()
        return Segment("var", match.group(0), quoted, raw=text[start : self.i])

    def _find(self, char: str, start: int) -> int:
        end = self.text.find(char, start)
        if end < 0:
            raise ExportError(f"the script has a {char} quote that is never closed.")
        return end

    def _closing(self, start: int, opening: str, closing: str) -> int:
        """The index of the bracket closing the one at ``start``, skipping quoted text."""
        depth, i = 0, start
        while i < len(self.text):
            c = self.text[i]
            if c == "'" and opening == "(":
                i = self._find("'", i + 1)
            elif c == "\\":
                i += 1
            elif c == opening:
                depth += 1
            elif c == closing:
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        raise ExportError(f"the script has a ${opening} that is never closed with {closing}.")


def _braced(inner: str, quoted: bool, *, raw: str) -> Segment:
    match = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?:\[([@*])\])?(?::?-(.*))?", inner, flags=re.DOTALL)
    if match is None:  # ${#A[@]}, ${A/x/y}, ...: not followed
        return Segment("cmd", inner, quoted, raw=raw)
    name, index, default = match.groups()
    return Segment("var", name, quoted, raw=raw, default=default, index=index)


def _literal(word: list[Segment]) -> str:
    return "".join(s.text for s in word) if all(s.kind == "lit" for s in word) else "\0"


# ---- parsing and expansion: tokens to commands ------------------------------------------------
def read_script(text: str) -> list[Command]:
    """The script's simple commands, in order, with their words expanded (module docstring);
    assignment-only commands are applied to later words, not returned."""
    variables: dict[str, str | list[str]] = {}
    commands: list[Command] = []
    for words in _commands(_Lexer(text).run()):
        if isinstance(words, tuple):  # NAME=( ... )
            name, elements = words
            variables[name] = [w for element in elements for w in _expand(element, variables)]
            continue
        command = _command(words, variables)
        if command is not None:
            commands.append(command)
    return commands


def _commands(tokens: list) -> list:
    """Words grouped by command, in order; an array assignment ``NAME=( ... )`` as (name, its
    element words)."""
    commands: list = [[]]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if isinstance(token, str):
            if token in SEPARATORS or token in "()":
                commands.append([])
            elif token in ("<", ">", ">>", ">&", "&>", "<<") and i + 1 < len(tokens):
                i += 1  # a redirection's target
        elif _is_array_start(token, tokens, i):
            end = _array_end(token, tokens, i + 2)
            commands += [(_literal(token)[:-1], [t for t in tokens[i + 2 : end] if not isinstance(t, str)]), []]
            i = end
        else:
            commands[-1].append(token)
        i += 1
    return [words for words in commands if words]


def _is_array_start(word: list[Segment], tokens: list, i: int) -> bool:
    text = _literal(word)
    return bool(ASSIGNMENT.fullmatch(text)) and i + 1 < len(tokens) and tokens[i + 1] == "("


def _array_end(word: list[Segment], tokens: list, i: int) -> int:
    """The index of the ``)`` closing the array that ``word`` starts."""
    while i < len(tokens) and tokens[i] != ")":
        i += 1
    if i >= len(tokens):
        raise ExportError(f"the script's array {_literal(word)}( is never closed with ).")
    return i


def _command(words: list[list[Segment]], variables: dict) -> Command | None:
    env: dict[str, Word] = {}
    while words and _assignment(words[0]):
        name, value = _assignment(words[0], variables)
        env[name] = value
        words = words[1:]
    if not words:
        variables.update(env)
        return None
    if _literal(words[0]) in DECLARERS:
        for word in words[1:]:
            if _assignment(word):
                name, value = _assignment(word, variables)
                variables[name] = value
        return None
    expanded = [w for word in words for w in _expand(word, variables)]
    return Command(words=expanded, env={k: v.text for k, v in env.items()}) if expanded else None


def _assignment(word: list[Segment], variables: dict | None = None):
    """``NAME=value`` as (name, value as one :class:`Word`), expanded without splitting; without
    ``variables``, whether the word is one."""
    first = word[0]
    match = ASSIGNMENT.match(first.text) if first.kind == "lit" and not first.quoted else None
    if variables is None or match is None:
        return match is not None
    rest = [Segment("lit", first.text[match.end() :], True)] + list(word[1:])
    return match.group(1), _joined(_expand(rest, variables, split=False))


def _expand(word: list[Segment], variables: dict, *, split: bool = True) -> list[Word]:
    """The fields one word expands to: unquoted expansions split on whitespace, unless unknown."""
    fields: list[Word] = [Word("")]
    started = False
    for segment in _flatten(word):
        pieces = _value(segment, variables)
        if segment.kind == "lit" or segment.quoted or not split:
            pieces = pieces if segment.kind == "var" and segment.index == "@" else [_joined(pieces)]
        else:
            pieces = [Word(t, p.unresolved) for p in pieces for t in ([p.text] if p.unresolved else p.text.split())]
        if not pieces:
            started = started or segment.quoted
            continue
        last = fields[-1]
        fields[-1] = Word(last.text + pieces[0].text, last.unresolved + pieces[0].unresolved)
        fields += pieces[1:]
        started = True
    return fields if started else []


def _joined(words: list[Word]) -> Word:
    return Word(" ".join(w.text for w in words), tuple(n for w in words for n in w.unresolved))


def _flatten(word: list[Segment]) -> list[Segment]:
    return [part for segment in word for part in (segment.parts or (segment,))]


def _value(segment: Segment, variables: dict) -> list[Word]:
    """A segment's value, as words that name the expansions in them that stay unknown."""
    if segment.kind == "lit":
        return [Word(segment.text)]
    if segment.kind == "cmd":
        return [Word(segment.raw, (segment.raw,))]
    if segment.kind == "arith":
        value = _arithmetic(segment.text, variables)
        return [Word(str(value))] if value is not None else [Word(segment.raw, (segment.raw,))]
    value = variables.get(segment.text)
    if value is None:
        if segment.default is not None:
            words = [t for t in _Lexer(segment.default).run() if not isinstance(t, str)]
            return [_joined([w for t in words for w in _expand(t, variables, split=False)])]
        return [Word(segment.raw, (segment.raw,))]
    return list(value) if isinstance(value, list) else [value]


_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.floordiv,  # shell arithmetic is integer
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _arithmetic(expression: str, variables: dict) -> int | None:
    """``$(( ... ))`` over integers and the script's variables (``$X`` or ``X``); None when a
    name is unknown or the expression is not + - * / % and parentheses."""

    def name_value(match: re.Match) -> str:
        value = variables.get(match.group(0))
        known = isinstance(value, Word) and not value.unresolved and value.text.strip().lstrip("-").isdigit()
        return value.text if known else "!"

    def parameter(match: re.Match) -> str:
        words = _expand(_Lexer(match.group(0)).run()[0], variables, split=False)
        return "!" if not words or words[0].unresolved else words[0].text

    text = re.sub(r"\$\{[^}]*\}|\$[A-Za-z_]\w*", parameter, expression)
    text = re.sub(r"\b[A-Za-z_]\w*\b", name_value, text)
    try:
        return _evaluate(ast.parse(text.strip(), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError):
        return None


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("not integer arithmetic")
