//! A gauge of things alive (sockets, streams, operations, groups), held by each of them.

/// Adds one to its gauge while it lives: however its holder ends (a return, an error, a panic that
/// unwinds), the gauge comes back down.
pub(crate) struct Counted(metrics::Gauge);

impl Counted {
    pub(crate) fn new(gauge: metrics::Gauge) -> Self {
        gauge.increment(1.0);
        Self(gauge)
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}
