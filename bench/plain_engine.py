"""The plain-engine side of bench/foundation.py: SGLang's own ``Engine``,
same engine arguments, only the CPU enablement patches (no scheduler hook).
Prints one JSON line: start_s, decode_tokens, decode_s, shutdown_s."""
from __future__ import annotations

import json
import sys
import time


def main() -> None:
    kwargs = json.loads(sys.argv[1])
    decode_tokens = int(sys.argv[2])
    import sglang

    t0 = time.monotonic()
    engine = sglang.Engine(**kwargs)
    start_s = time.monotonic() - t0
    engine.generate(input_ids=[1] * 16, sampling_params={"max_new_tokens": 4, "ignore_eos": True})
    t0 = time.monotonic()
    out = engine.generate(input_ids=[1] * 16,
                          sampling_params={"max_new_tokens": decode_tokens, "ignore_eos": True})
    decode_s = time.monotonic() - t0
    t0 = time.monotonic()
    engine.shutdown()
    shutdown_s = time.monotonic() - t0
    print(json.dumps({"start_s": start_s, "decode_tokens": len(out["output_ids"]),
                      "decode_s": decode_s, "shutdown_s": shutdown_s}), flush=True)


if __name__ == "__main__":
    main()
