//! Nothing here: the models are in `tests/`, compiled only under `--cfg turnstile_loom`.
