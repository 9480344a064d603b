//! Checks of idem against rig-core itself (its `Tool` trait and its dispatch); see `tests/`.
//! A workspace member of its own, so that building the facade's examples never builds rig.
