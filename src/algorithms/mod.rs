//! The seeds' other algorithms, behind the same [`Decision`](crate::Decision).
