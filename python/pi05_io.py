"""pi05_io.py — the arithmetic openpi does around a Pi0.5 call, for feeding nib real robot data.

nib takes token ids, camera frames and (optionally) noise, and returns the model's actions
[horizon][32] in the normalized space the model was trained in. openpi does three more things
around the model, and a robot that swaps openpi for nib needs them too (docs/pi05-inputs.md):

  1. the robot state, quantile-normalized with the checkpoint's norm stats, discretized into
     256 bins and written into the prompt ("Task: ..., State: 12 200 ...;\\nAction: "), which is
     then tokenized with PaliGemma's SentencePiece model (not done here: nib takes ids);
  2. camera frames resized to 224 x 224 with padding (not done here; nib takes U8 frames);
  3. the actions un-normalized with the checkpoint's action norm stats.

This module does 1 (but the tokenizer) and 3, exactly as ../shared/reference/pi05.md §2.3 and
§2.6 describe openpi's code, in double precision. No dependencies; NumPy arrays work as inputs.
"""
import bisect

STATE_BINS = 256
# np.linspace(-1, 1, 257)[:-1]: the left edges of the 256 bins; every edge is exact in binary
_EDGES = [-1.0 + i * (2.0 / STATE_BINS) for i in range(STATE_BINS)]


def _floats(x, what):
    try:
        return [float(v) for v in x]
    except TypeError:
        raise TypeError("pi05_io: %s must be a sequence of numbers" % what) from None


def normalize_quantile(x, q01, q99):
    """(x - q01) / (q99 - q01 + 1e-6) * 2 - 1, per dim (openpi's quantile normalization)."""
    x, q01, q99 = _floats(x, "x"), _floats(q01, "q01"), _floats(q99, "q99")
    if not (len(x) == len(q01) == len(q99)):
        raise ValueError("pi05_io: x, q01, q99 have %d, %d, %d dims" % (len(x), len(q01), len(q99)))
    return [(v - a) / (b - a + 1e-6) * 2.0 - 1.0 for v, a, b in zip(x, q01, q99)]


def unnormalize_quantile(x, q01, q99):
    """(x + 1) / 2 * (q99 - q01 + 1e-6) + q01, per dim: the inverse of normalize_quantile."""
    x, q01, q99 = _floats(x, "x"), _floats(q01, "q01"), _floats(q99, "q99")
    if not (len(x) == len(q01) == len(q99)):
        raise ValueError("pi05_io: x, q01, q99 have %d, %d, %d dims" % (len(x), len(q01), len(q99)))
    return [(v + 1.0) / 2.0 * (b - a + 1e-6) + a for v, a, b in zip(x, q01, q99)]


def state_bins(normalized):
    """np.digitize(s, np.linspace(-1, 1, 257)[:-1]) - 1 per dim: 0..255, or -1 below -1."""
    return [bisect.bisect_right(_EDGES, v) - 1 for v in _floats(normalized, "normalized state")]


def discretize_state(state, q01, q99):
    """The robot's real state dims (before any padding to 32), normalized with the checkpoint's
    state q01 / q99 and binned: what openpi writes into a Pi0.5 prompt."""
    return state_bins(normalize_quantile(state, q01, q99))


def pi05_prompt(task, bins):
    """openpi's Pi0.5 prompt with the discrete state (discrete_state_input=True: pi05_droid,
    pi05_base): tokenize it with PaliGemma's tokenizer, add_bos=True, and pass the ids, unpadded.
    (pi05_libero has discrete_state_input=False: its prompt is BOS + task + "\\n", no state.)"""
    clean = str(task).strip().replace("_", " ").replace("\n", " ")
    return "Task: %s, State: %s;\nAction: " % (clean, " ".join(str(int(b)) for b in bins))


def unnormalize_actions(actions, q01, q99):
    """nib's actions [horizon][32] -> the first len(q01) dims of each row, un-normalized with the
    checkpoint's action q01 / q99. openpi's config may slice further or convert the result (e.g.
    relative to absolute actions); that part is config-specific and not reproduced here."""
    q01, q99 = _floats(q01, "q01"), _floats(q99, "q99")
    n = len(q01)
    out = []
    for i, row in enumerate(actions):
        row = _floats(row, "actions row %d" % i)
        if len(row) < n:
            raise ValueError("pi05_io: actions row %d has %d values, fewer than the %d dims of q01" % (i, len(row), n))
        out.append(unnormalize_quantile(row[:n], q01, q99))
    return out
