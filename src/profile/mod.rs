//! Recorded samples: the model writers consume, the bounded aggregator, and
//! what a source path says about its file (`paths`).

pub mod aggregate;
pub mod model;
pub mod paths;
