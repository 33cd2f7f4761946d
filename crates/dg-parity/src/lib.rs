//! dg-parity
