//! What is in force: a value (the plans, the plugin's configuration) a reload replaces whole,
//! read once by each request. Start-up puts the first in force; `reload` replaces it.

use std::sync::{Arc, RwLock};

use crate::plan::Plans;

/// A value in force (the plans, the plugin's configuration), replaced whole by a reload. A
/// request reads it once, when its header arrives, and runs under that value to its end.
#[derive(Debug)]
pub struct Current<T>(RwLock<Arc<T>>);

impl<T> Current<T> {
    pub fn new(value: impl Into<Arc<T>>) -> Self {
        Current(RwLock::new(value.into()))
    }

    /// The value in force now.
    pub fn current(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Put `value` in force; returns the one it replaced.
    pub fn replace(&self, value: impl Into<Arc<T>>) -> Arc<T> {
        std::mem::replace(
            &mut *self.0.write().unwrap_or_else(|e| e.into_inner()),
            value.into(),
        )
    }
}

/// The plans in force.
pub type PlanSource = Current<Plans>;
