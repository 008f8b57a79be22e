//! Scheduling bookkeeping: pure CPU, no tensors.

pub mod prefix;
