"""Offline training of the served models: the synthetic corpus (corpus.py, phrases_*.py,
slots.py, hard_negatives.py) and a hand-written check set (handwritten.py); versions 1 and 2
of ticket_classifier (train.py, with e5_export.py for v2's encoder) and the refund-intent
head (intent.py); new versions from reviewers' decisions (builds.py, feedback.py); the INT8
encoder (quantize.py).

Not a runtime package: it writes into inference_gateway/model_repository/ and
inference_gateway/intent_model/ and imports the serving code it copies there
(inference_gateway/model/), but no runtime package imports it.
"""
