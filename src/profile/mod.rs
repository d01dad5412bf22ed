//! Recorded samples: the model writers consume, and the bounded aggregator.

pub mod aggregate;
pub mod model;
