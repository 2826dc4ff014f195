"""The hybrid engine's llama.cpp language model, in a child process: ``python -m service.engine.llama_worker FD``.

The child owns libllama (through libvlfleet_llama.so, ops/llamacpp/vlfleet_llama.c) so a native crash ends the
child, not the service: the parent (service.engine.llama_lm) sees the connection close and says so. It answers
calls on the connection ``FD`` (a socketpair end the parent passed it), one at a time: a call is
``(name, args)``, the answer ``("ok", value)``, ``("full", message)`` (no room in the KV cache)
or ``("error", message)``. Logits come back as float32 arrays.

It imports numpy and this module only, so it starts in well under a second besides the model's load.
"""

from __future__ import annotations

import ctypes
import sys
from multiprocessing.connection import Connection

import numpy as np

_I32P = ctypes.POINTER(ctypes.c_int32)
_F32P = ctypes.POINTER(ctypes.c_float)
FULL_CACHE = 1  # llama_decode's code for "no room in the KV cache"
INTERFACE = 4  # vlfleet_llama.c's VL_INTERFACE: the functions bound below, with these signatures


def _interface(lib: ctypes.CDLL) -> int:
    try:
        lib.vl_interface.restype = ctypes.c_int32
    except AttributeError:
        return 1  # the first interface had no number
    return lib.vl_interface()


def _bind(lib: ctypes.CDLL, path: str) -> ctypes.CDLL:
    found = _interface(lib)
    if found != INTERFACE:
        raise RuntimeError(f"{path} is interface {found} of libvlfleet_llama.so and this service needs {INTERFACE}: "
                           "install the vlfleet-llama-server wheel of this release (`vlfleet llamacpp.wheel`), or "
                           "point VLFLEET_LLAMACPP_LIB at the one `vlfleet llamacpp.build` prints")
    lib.vl_open.restype = ctypes.c_void_p
    lib.vl_open.argtypes = [ctypes.c_char_p] + [ctypes.c_int32] * 6
    lib.vl_close.argtypes = [ctypes.c_void_p]
    for name in ("vl_n_vocab", "vl_n_embd_inp", "vl_n_ctx"):
        getattr(lib, name).argtypes = [ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_int32
    lib.vl_seq_rm.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32]
    lib.vl_decode_tokens.argtypes = [ctypes.c_void_p, ctypes.c_int32, _I32P, _I32P, ctypes.c_int32, _F32P]
    lib.vl_decode_embd.argtypes = [ctypes.c_void_p, ctypes.c_int32, _F32P, _I32P, ctypes.c_int32, _F32P]
    lib.vl_decode_step.argtypes = [ctypes.c_void_p, _I32P, _I32P, _I32P, ctypes.c_int32, ctypes.c_int32, _F32P]
    for name in ("vl_seq_rm", "vl_decode_tokens", "vl_decode_embd", "vl_decode_step"):
        getattr(lib, name).restype = ctypes.c_int32
    for name in ("vl_seq_get_state", "vl_seq_set_state"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int64]
        getattr(lib, name).restype = ctypes.c_int64
    return lib


def _i32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int32)


def _ptr(a: np.ndarray, kind):
    return a.ctypes.data_as(kind)


class Model:
    """One loaded GGUF language model and its context (n_seq sequences in one KV cache)."""

    def __init__(self, lib_path: str, gguf: str, n_ctx: int, n_seq: int, n_threads: int, n_batch: int,
                 verbose: bool = False, flash_attn: bool = True):
        self.lib = _bind(ctypes.CDLL(lib_path), lib_path)
        self.handle = self.lib.vl_open(gguf.encode(), n_ctx, n_seq, n_threads, n_batch, int(verbose), int(flash_attn))
        if not self.handle:
            raise RuntimeError(f"llama.cpp could not load {gguf} (its messages are in the service's log)")
        self.n_vocab = self.lib.vl_n_vocab(self.handle)

    def close(self) -> None:
        """Free the context and the model (the worker's process ends instead; the bench opens a second model)."""
        self.lib.vl_close(self.handle)
        self.handle = None

    def info(self) -> dict:
        h = self.handle
        return {"n_vocab": self.n_vocab, "n_embd_inp": self.lib.vl_n_embd_inp(h),
                "n_ctx": self.lib.vl_n_ctx(h)}

    def seq_rm(self, seq: int, p0: int) -> None:
        self._check(self.lib.vl_seq_rm(self.handle, seq, p0), "cutting a sequence")

    def tokens(self, seq: int, ids, pos, logits: bool) -> np.ndarray | None:
        ids, pos = _i32(ids), _i32(pos)
        out = np.empty(self.n_vocab, np.float32) if logits else None
        rc = self.lib.vl_decode_tokens(self.handle, seq, _ptr(ids, _I32P), _ptr(pos, _I32P), len(ids),
                                       _ptr(out, _F32P) if logits else None)
        self._check(rc, "decoding text")
        return out

    def embeddings(self, seq: int, rows, pos4, logits: bool) -> np.ndarray | None:
        rows, pos4 = np.ascontiguousarray(rows, dtype=np.float32), _i32(pos4)
        out = np.empty(self.n_vocab, np.float32) if logits else None
        rc = self.lib.vl_decode_embd(self.handle, seq, _ptr(rows, _F32P), _ptr(pos4, _I32P), len(rows),
                                     _ptr(out, _F32P) if logits else None)
        self._check(rc, "decoding image embeddings")
        return out

    def step(self, seqs, ids, pos, pad: bool = False) -> np.ndarray:
        """One decode step of several sequences; ``pad``: a fourth row for a step of 3 (see vlfleet_llama.c)."""
        seqs, ids, pos = _i32(seqs), _i32(ids), _i32(pos)
        out = np.empty((len(ids), self.n_vocab), np.float32)
        rc = self.lib.vl_decode_step(self.handle, _ptr(seqs, _I32P), _ptr(ids, _I32P), _ptr(pos, _I32P),
                                     len(ids), int(pad), _ptr(out, _F32P))
        self._check(rc, "a decode step")
        return out

    def get_state(self, seq: int) -> bytes:
        """The sequence's KV in llama.cpp's serialised form (service.engine.kv_handoff reads its layout)."""
        size = self.lib.vl_seq_get_state(self.handle, seq, None, 0)
        buf = ctypes.create_string_buffer(size)
        if self.lib.vl_seq_get_state(self.handle, seq, buf, size) != size:
            raise RuntimeError("llama.cpp could not serialise a sequence's KV")
        return buf.raw

    def set_state(self, seq: int, blob: bytes) -> None:
        """Replace the sequence's KV with ``blob`` (that form)."""
        if self.lib.vl_seq_set_state(self.handle, seq, blob, len(blob)) != len(blob):
            raise RuntimeError("llama.cpp refused the handed-over KV (its log says why)")

    @staticmethod
    def _check(rc: int, what: str) -> None:
        if rc == FULL_CACHE:
            raise MemoryError(f"{what}: the KV cache is full")
        if rc != 0:
            raise RuntimeError(f"{what} failed in llama.cpp (code {rc})")


def serve(conn: Connection) -> None:
    """Answer calls until the parent closes the connection. The first call must be ``open``."""
    model: Model | None = None
    while True:
        try:
            name, args = conn.recv()
        except EOFError:
            return
        try:
            if name == "open":
                model = Model(*args)
                value = model.info()
            else:
                value = getattr(model, name)(*args)
        except MemoryError as e:
            conn.send(("full", str(e)))
            continue
        except (RuntimeError, OSError, TypeError, AttributeError) as e:
            conn.send(("error", f"{type(e).__name__}: {e}"))
            continue
        conn.send(("ok", value))


def main(argv: list[str]) -> int:
    serve(Connection(int(argv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
