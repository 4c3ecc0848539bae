"""A trainer's hidden-state dump written from text through a target the workbook can run: held-out text
cut into windows, each window's chosen boundaries captured and saved in the trainer's layout (to check a
trainer's output, or to test). ``python -m helpers dump`` (``commands.dump``) parses its options, calls
``write_from_text`` and prints."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import BadOption, read_text_file
from ..investigation.dumps import write_dump
from ..investigation.pair import text_windows
from ..model.target import check_target_folder, load_target
from ..rules.conventions import read_target_config


def dump_text_path(target_dir, text_path=None) -> tuple[Path, bool]:
    """The text to dump and whether it was chosen for the user: ``heldout.txt`` in the folder that holds
    the target (the layout ``build-default`` writes), never another model's text."""
    if text_path is not None:
        return Path(text_path), False
    beside = Path(target_dir).parent / "heldout.txt"
    if beside.is_file():
        return beside, True
    raise BadOption(f"no heldout.txt beside {target_dir} (looked for {beside}); pass --text FILE with text "
                    f"for this target (the embedded pair's text is not used for another model)")


def write_from_text(target_dir, boundaries, fmt, out, text_path=None, window: int = 256, records: int = 12,
                    device: str = "cpu", progress: bool = False, say_text: bool = False) -> Path:
    """Tokenise held-out text into windows and dump them: the records a trainer would have saved."""
    target_dir = Path(target_dir)
    check_target_folder(target_dir)     # a broken target is named as such, before any text is looked for
    text_path, chosen = dump_text_path(target_dir, text_path)
    tcfg = read_target_config(target_dir)
    positions = tcfg.get("max_position_embeddings")
    if isinstance(positions, int) and not isinstance(positions, bool) and window > positions:
        raise BadOption(f"--window {window} is longer than the target's {positions} positions "
                        f"(max_position_embeddings in {target_dir / 'config.json'}); use at most {positions}")
    L = tcfg["num_hidden_layers"]
    beyond = [b for b in boundaries if not 0 <= b <= L]
    if beyond:
        raise BadOption(f"--boundaries {','.join(map(str, boundaries))}: {beyond} outside 0..{L} (the target "
                        f"has {L} layers)")
    text = read_text_file(text_path, "text file")
    target, tok = load_target(target_dir, device)
    windows = text_windows(tok, text, window, records, min_windows=1).to(device)
    if chosen and say_text:     # after every check that can refuse, so an error is the only line
        print(f"text: {text_path} (heldout.txt beside the target; --text FILE for another)", file=sys.stderr)
    return write_dump(target, windows, boundaries, fmt, out, progress=progress)
