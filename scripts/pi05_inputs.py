#!/usr/bin/env python3
"""Write a Pi0.5 inputs file for `nib run pi05 --inputs`: deterministic pseudo-random camera
images (U8 [V,224,224,3]) and text token ids (I32 [L]), standard library only.

    python3 scripts/pi05_inputs.py OUT.safetensors [--cameras 2] [--text 20] [--vocab 257152] [--seed 1]
"""
import argparse
import json
import random
import struct
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--cameras", type=int, default=2)
    ap.add_argument("--text", type=int, default=20)
    ap.add_argument("--vocab", type=int, default=257152)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.cameras < 1 or a.text < 0 or a.vocab < 1 or a.image < 1:
        print("pi05_inputs.py: --cameras >= 1, --text >= 0, --vocab >= 1, --image >= 1", file=sys.stderr)
        return 2
    rng = random.Random(a.seed)
    img = bytes(rng.getrandbits(8) for _ in range(a.cameras * a.image * a.image * 3))
    ids = struct.pack("<%di" % a.text, *[rng.randrange(a.vocab) for _ in range(a.text)])
    header = {
        "images": {"dtype": "U8", "shape": [a.cameras, a.image, a.image, 3], "data_offsets": [0, len(img)]},
        "text_ids": {"dtype": "I32", "shape": [a.text], "data_offsets": [len(img), len(img) + len(ids)]},
    }
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(a.out, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + img + ids)
    print("wrote %s: images U8 [%d,%d,%d,3], text_ids I32 [%d]" % (a.out, a.cameras, a.image, a.image, a.text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
