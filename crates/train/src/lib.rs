//! Training for the Keras-exact, projected and baseline models: exact optimizers, the loss,
//! training-parity checks against the real libraries, and the synthetic sequence task.

pub mod bench;
pub mod config;
pub mod export;
mod figure;
pub mod loss;
pub mod models;
pub mod optim;
pub mod parity;
pub mod paths;
pub mod progress;
pub use model::rng;
pub mod run;
pub mod study;
pub mod task;
