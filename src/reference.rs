//! Reference models, kept for tests and comparisons, not for production.
