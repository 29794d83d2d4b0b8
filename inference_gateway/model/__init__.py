"""What serves ticket_classifier: the code its versions run (featurize.py for v1;
e5_tokenizer.py, e5_runtime.py and the Triton templates triton_v2.py, triton_v2_int8.py for
v2), the repository's layout (repository.py) and live rollout (rollout.py). Training, which
copies these files into each version directory, is the `training` package."""
