//! Compatibility checks of idem-runtime with serde_json's optional features on; see `tests/`.
