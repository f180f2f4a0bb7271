"""nib.py: Python access to nib's Pi0.5 policy.

A ctypes wrapper over build/libnib.so (the C API in include/nib.h); no dependencies. NumPy
arrays are accepted without a copy, and actions come back as a NumPy array when NumPy is
installed (a list of lists of floats otherwise).

    import nib
    policy = nib.Pi05Policy("model.safetensors", preset="fast")  # load once
    actions = policy.run(frames_u8, text_ids, horizon=10)          # every control tick
    policy.close()

frames_u8: uint8 [V, 224, 224, 3] camera frames (or float32 [V, 3, 224, 224] in [-1, 1]).
The library is found through NIB_LIB, else ../build/libnib.so next to this file.
"""
import array
import ctypes
import os

__all__ = ["NibError", "Pi05Policy", "load_library"]


class NibError(RuntimeError):
    """A nib call failed. .status is the status name ("NIB_ERR_SHAPE"), .message nib's message."""

    def __init__(self, status, message):
        super().__init__("%s: %s" % (status, message))
        self.status = status
        self.message = message


_lib = None


def load_library(path=None):
    """Load libnib.so once (path, else $NIB_LIB, else ../build/libnib.so next to this file)."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    path = path or os.environ.get("NIB_LIB") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), os.pardir, "build", "libnib.so")
    try:
        lib = ctypes.CDLL(os.path.abspath(path))
    except OSError as e:
        raise OSError("nib: cannot load %s (%s); build it with `make -j` in the nib checkout, or set NIB_LIB"
                      % (path, e)) from None
    c_p, c_i32, c_i64, c_u64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64, ctypes.c_uint64
    lib.nib_status_name.argtypes, lib.nib_status_name.restype = [ctypes.c_int], ctypes.c_char_p
    lib.nib_last_error.argtypes, lib.nib_last_error.restype = [], ctypes.c_char_p
    lib.nib_pi05_policy_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, c_i32,
                                         ctypes.POINTER(c_p)]
    lib.nib_pi05_policy_open.restype = ctypes.c_int
    lib.nib_pi05_policy_close.argtypes, lib.nib_pi05_policy_close.restype = [c_p], None
    lib.nib_pi05_policy_size.argtypes, lib.nib_pi05_policy_size.restype = [c_p, ctypes.c_int], c_i64
    lib.nib_pi05_policy_run.argtypes = [c_p, c_i32, c_p, c_p, c_p, c_p, c_i32, c_i32, c_p, c_u64, c_p]
    lib.nib_pi05_policy_run.restype = ctypes.c_int
    if path is None or _lib is None:
        _lib = lib
    return lib


def _check(lib, st):
    if st != 0:
        raise NibError(lib.nib_status_name(st).decode(), lib.nib_last_error().decode(errors="replace"))


def _buffer(obj, what, formats):
    """(pointer, keep-alive, format, nbytes) of a C-contiguous buffer whose item format is in formats."""
    mv = memoryview(obj)
    fmt = mv.format.lstrip("@=<")
    if fmt not in formats:
        raise TypeError("nib: %s must hold %s items, not format %r" % (what, " or ".join(sorted(formats)), mv.format))
    if not mv.c_contiguous:
        raise ValueError("nib: %s must be C-contiguous" % what)
    if hasattr(obj, "ctypes") and hasattr(obj.ctypes, "data"):  # NumPy: no copy
        return ctypes.c_void_p(obj.ctypes.data), obj, fmt, mv.nbytes
    if not mv.readonly and mv.nbytes:
        keep = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
    else:
        keep = (ctypes.c_char * max(mv.nbytes, 1)).from_buffer_copy(mv.tobytes() or b"\0")
    return ctypes.cast(keep, ctypes.c_void_p), keep, fmt, mv.nbytes


class Pi05Policy:
    """A Pi0.5 checkpoint loaded once (nib_pi05_policy_open) and called per control tick."""

    _SIZES = ("max_cameras", "image_size", "max_text", "max_horizon", "action_dim", "vocab", "steps")

    def __init__(self, checkpoint, preset="fast", precision=None, max_horizon=0, library=None):
        """preset: "fast" or "bf16" (GPU), "ref" (fp32 CPU reference); precision: per-component
        overrides such as "vision=bf16,kv=fp8"; max_horizon: the largest horizon you will ask for
        (0: the checkpoint's)."""
        self._lib = load_library(library)
        self._p = ctypes.c_void_p()
        _check(self._lib, self._lib.nib_pi05_policy_open(
            os.fsencode(checkpoint), preset.encode(), precision.encode() if precision else None,
            int(max_horizon), ctypes.byref(self._p)))
        for i, name in enumerate(self._SIZES):
            setattr(self, name, int(self._lib.nib_pi05_policy_size(self._p, i)))

    def close(self):
        """Free the model (the object is unusable afterwards); closing twice is harmless."""
        if getattr(self, "_p", None):
            self._lib.nib_pi05_policy_close(self._p)
            self._p = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()

    def run(self, images, text_ids, horizon=None, image_mask=None, noise=None, seed=0):
        """One policy call; returns the actions [horizon][action_dim].

        images: uint8 [V, S, S, 3] camera frames or float32 [V, 3, S, S] in [-1, 1] (S = image_size),
        any C-contiguous buffer (NumPy array, bytes, bytearray, array.array('B' or 'f')); V is its
        size over one image's. text_ids: token ids (ints). image_mask: V zeros / ones (masked cameras
        are skipped). noise: float32 [horizon, action_dim], else N(0, 1) from seed. horizon: from
        noise when given, else required."""
        if not self._p:
            raise ValueError("nib: this policy is closed")
        S = self.image_size
        per = 3 * S * S
        ptr, keep_img, fmt, nbytes = _buffer(images, "images", {"B", "f"})
        esz = 1 if fmt == "B" else 4
        if nbytes % (per * esz):
            raise ValueError("nib: images hold %d bytes, not a whole number of %s images of %d bytes" %
                             (nbytes, "U8 [S,S,3]" if esz == 1 else "F32 [3,S,S]", per * esz))
        V = nbytes // (per * esz)
        ids = array.array("i", [int(x) for x in text_ids])
        ids_ptr, keep_ids, _, _ = _buffer(ids, "text_ids", {"i"})
        mask_ptr, keep_mask = None, None
        if image_mask is not None:
            mask = bytes(1 if m else 0 for m in image_mask)
            if len(mask) != V:
                raise ValueError("nib: image_mask has %d entries for %d images" % (len(mask), V))
            mask_ptr, keep_mask, _, _ = _buffer(mask, "image_mask", {"B"})
        noise_ptr, keep_noise = None, None
        if noise is not None:
            noise_ptr, keep_noise, _, nb = _buffer(noise, "noise", {"f"})
            if nb % (4 * self.action_dim):
                raise ValueError("nib: noise holds %d floats, not a multiple of action_dim %d" % (nb // 4, self.action_dim))
            if horizon is None:
                horizon = nb // (4 * self.action_dim)
            elif nb != 4 * self.action_dim * horizon:
                raise ValueError("nib: noise holds %d floats, horizon %d needs %d" % (nb // 4, horizon,
                                                                                     horizon * self.action_dim))
        if horizon is None:
            raise ValueError("nib: give horizon= (or noise=)")
        out = (ctypes.c_float * (int(horizon) * self.action_dim))()
        _check(self._lib, self._lib.nib_pi05_policy_run(
            self._p, V, ptr if esz == 4 else None, ptr if esz == 1 else None, mask_ptr, ids_ptr, len(ids),
            int(horizon), noise_ptr, int(seed) & (2**64 - 1), out))
        del keep_img, keep_ids, keep_mask, keep_noise
        try:
            import numpy as np
            return np.frombuffer(out, dtype=np.float32).reshape(int(horizon), self.action_dim).copy()
        except ImportError:
            A = self.action_dim
            return [list(out[h * A:(h + 1) * A]) for h in range(int(horizon))]
