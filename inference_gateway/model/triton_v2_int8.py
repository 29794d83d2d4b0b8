"""Triton Python-backend model of `ticket_classifier`'s INT8 v2 (`model build --type v2-int8`).

The same serving code as version 2 (`triton_v2.py`, copied next to this file as
`triton_v2.py`), with an encoder quantised by `quantize.py`, run one ticket per onnxruntime
call: its activations are quantised per tensor, so a ticket encoded beside others (padding
included) would get slightly different scores, which a batching gateway with a response
cache must not see. On a CPU one ticket per call costs about the same per ticket.
"""

from __future__ import annotations

import triton_v2  # the v2 template, copied into the version directory beside this file

ROWS_PER_CALL = 1


class TritonPythonModel(triton_v2.TritonPythonModel):
    def initialize(self, args: dict) -> None:
        super().initialize(args)
        self.classifier.encoder.max_chunk_rows = ROWS_PER_CALL
