//! The CPU reference backend: f32, slow, obvious; the oracle for every GPU kernel.
