//! dg-gpu
