"""Run the vendored ``convert_hf_to_gguf.py`` of a llama.cpp tree, with one documented exception.

    python ops/llamacpp/hf_to_gguf.py LLAMA_CPP_TREE [--pre-tokenizer-fallback NAME] -- CONVERTER_ARGS...

The converter recognises a BPE tokenizer's pre-tokenizer by the hash of a test string's token ids and refuses a
tokenizer whose hash is not in its table (``TextModel.get_vocab_base_pre`` raises NotImplementedError). The real
Qwen3-VL tokenizer is in the table; vlfleet's synthetic checkpoints (ops/model/synth.py) keep Qwen's layout and
regex pre-tokenizer but with a filler vocabulary, so their hash is unknown. With ``--pre-tokenizer-fallback NAME``
that one method is wrapped: a recognised hash is used as the converter decides, an unknown one writes NAME as
``tokenizer.ggml.pre`` (metadata only) and says so on stderr. Nothing in the vendored tree is edited.

Run as a script (not imported by vlfleet) because the converter's modules must come first on sys.path.
"""

from __future__ import annotations

import sys
from pathlib import Path

FALLBACK_MARK = "vlfleet: pre-tokenizer hash not recognised; wrote tokenizer.ggml.pre ="


def split_args(argv: list[str]) -> tuple[Path, str | None, list[str]]:
    """(tree, fallback, converter args) from ``TREE [--pre-tokenizer-fallback NAME] -- ARGS...``."""
    if "--" not in argv or argv.index("--") < 1:
        raise SystemExit("usage: hf_to_gguf.py LLAMA_CPP_TREE [--pre-tokenizer-fallback NAME] -- CONVERTER_ARGS...")
    cut = argv.index("--")
    ours, theirs = argv[:cut], argv[cut + 1:]
    tree, fallback = Path(ours[0]), None
    rest = ours[1:]
    if rest[:1] == ["--pre-tokenizer-fallback"] and len(rest) == 2:
        fallback = rest[1]
    elif rest:
        raise SystemExit(f"hf_to_gguf.py: unexpected arguments before '--': {rest}")
    return tree, fallback, theirs


def patch_pre_tokenizer(text_model_class: type, fallback: str) -> None:
    """Wrap ``get_vocab_base_pre`` so that only an unrecognised hash falls back to ``fallback``."""
    original = text_model_class.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return original(self, tokenizer)
        except NotImplementedError:
            print(f"{FALLBACK_MARK} {fallback!r} (the checkpoint's tokenizer is not one the converter knows; "
                  "only this metadata key is affected)", file=sys.stderr, flush=True)
            return fallback

    text_model_class.get_vocab_base_pre = get_vocab_base_pre


def main(argv: list[str]) -> None:
    tree, fallback, args = split_args(argv)
    converter = tree / "convert_hf_to_gguf.py"
    if not converter.is_file():
        raise SystemExit(f"hf_to_gguf.py: {converter} does not exist (fetch the source: vlfleet llamacpp.source)")
    # Not this script's directory (its gguf.py would shadow the converter's gguf package); then the converter's
    # own first steps: its package beside it, and its bundled gguf-py before any installed gguf.
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(tree), str(tree / "gguf-py"), *(p for p in sys.path if Path(p or ".").resolve() != here)]
    if fallback:
        from conversion.base import TextModel

        patch_pre_tokenizer(TextModel, fallback)
    import convert_hf_to_gguf

    sys.argv = [str(converter), *args]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main(sys.argv[1:])
