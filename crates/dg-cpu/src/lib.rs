//! dg-cpu
