//! dg-kernels
