//! Shared helpers for the end-to-end and golden tests.
