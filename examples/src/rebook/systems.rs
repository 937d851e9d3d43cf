//! The systems the assistant acts on, faked in-process: the order system, the carrier and the
//! warehouse. Each keeps its own records, so a duplicate action is visible as a second record.
//! Their APIs take an idempotency key the way real ones do (a repeated key returns the first
//! result instead of acting again), and answer "what happened to this key?" for reconcilers.
//! The naive loop in [`super::naive`] calls them without keys, as code without an operation
//! log would.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

use serde::{Deserialize, Serialize};

/// An order, as the order system holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// Its id.
    pub order_id: String,
    /// Who ordered.
    pub customer: String,
    /// The carrier it ships with now.
    pub carrier: String,
    /// Days until delivery as the carrier says now.
    pub eta_days: u32,
    /// Days the customer was promised.
    pub promised_days: u32,
    /// Where it ships from.
    pub warehouse: String,
}

/// One action a system carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Applied {
    /// The order it concerns.
    pub order_id: String,
    /// The key it was asked under (`None`: asked without one).
    pub key: Option<String>,
    /// What it did.
    pub what: String,
    /// The reference it answered with.
    pub reference: String,
}

/// One system's records.
#[derive(Debug, Default)]
pub struct Ledger {
    applied: Vec<Applied>,
    /// Every request, by order, a repeated key's included: what was asked, not what was done.
    asked: Vec<String>,
}

impl Ledger {
    /// Acts once per key: a repeated key answers the first reference. Without a key it acts
    /// every time, as an API without idempotency does. References count per order, so a
    /// second action for the same order shows as `-2`.
    fn apply(&mut self, prefix: &str, key: Option<&str>, order_id: &str, what: String) -> String {
        self.asked.push(order_id.to_owned());
        if let Some(key) = key {
            let earlier = self.applied.iter().find(|a| a.key.as_deref() == Some(key));
            if let Some(earlier) = earlier {
                return earlier.reference.clone();
            }
        }
        let reference = format!("{prefix}-{}", self.for_order(order_id).len() + 1);
        let key = key.map(str::to_owned);
        let applied = Applied {
            order_id: order_id.to_owned(),
            key,
            what,
            reference: reference.clone(),
        };
        self.applied.push(applied);
        reference
    }

    fn find(&self, key: &str) -> Option<String> {
        let found = self.applied.iter().find(|a| a.key.as_deref() == Some(key));
        found.map(|a| a.reference.clone())
    }

    /// Records for `order_id`.
    fn for_order(&self, order_id: &str) -> Vec<Applied> {
        let of_order = self.applied.iter().filter(|a| a.order_id == order_id);
        of_order.cloned().collect()
    }
}

/// The three systems.
#[derive(Debug, Default)]
pub struct Systems {
    orders: Mutex<HashMap<String, Order>>,
    carrier: Mutex<Ledger>,
    warehouse: Mutex<Ledger>,
    eta_updates: Mutex<Ledger>,
}

/// The process's systems. They outlive any worker, as real downstreams do; activities reach
/// them through this global because an activity is a free function. A real adapter would hold
/// a client (a connection pool, a base URL) in the same kind of process-wide handle.
pub fn systems() -> &'static Systems {
    static SYSTEMS: OnceLock<Systems> = OnceLock::new();
    SYSTEMS.get_or_init(Systems::default)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the systems did for one order: how many times each action happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applications {
    /// Carrier rebookings.
    pub rebookings: usize,
    /// Warehouse notifications.
    pub warehouse_notices: usize,
    /// Customer ETA updates.
    pub eta_updates: usize,
}

impl Systems {
    /// The order, seeded on first sight: it ships late with `slowship`.
    pub fn order(&self, order_id: &str) -> Order {
        let mut orders = lock(&self.orders);
        let order = orders.entry(order_id.to_owned()).or_insert_with(|| Order {
            order_id: order_id.to_owned(),
            customer: "Ada Byrne".into(),
            carrier: "slowship".into(),
            eta_days: 9,
            promised_days: 4,
            warehouse: "DUB-2".into(),
        });
        order.clone()
    }

    /// Books `order_id` onto `carrier`.
    pub fn rebook(&self, key: Option<&str>, order_id: &str, carrier: &str) -> String {
        let what = format!("rebook {order_id} onto {carrier}");
        let reference = lock(&self.carrier).apply("BK", key, order_id, what);
        if let Some(order) = lock(&self.orders).get_mut(order_id) {
            order.carrier = carrier.to_owned();
        }
        reference
    }

    /// The booking made under `key`, if any.
    pub fn find_booking(&self, key: &str) -> Option<String> {
        lock(&self.carrier).find(key)
    }

    /// Tells the warehouse about the change.
    pub fn notify_warehouse(&self, key: Option<&str>, order_id: &str, note: &str) -> String {
        let what = format!("notice for {order_id}: {note}");
        lock(&self.warehouse).apply("WH", key, order_id, what)
    }

    /// The notice sent under `key`, if any.
    pub fn find_notice(&self, key: &str) -> Option<String> {
        lock(&self.warehouse).find(key)
    }

    /// Sets the ETA the customer sees.
    pub fn update_eta(&self, key: Option<&str>, order_id: &str, eta_days: u32) -> String {
        let what = format!("eta of {order_id} is {eta_days} days");
        let reference = lock(&self.eta_updates).apply("ETA", key, order_id, what);
        if let Some(order) = lock(&self.orders).get_mut(order_id) {
            order.eta_days = eta_days;
        }
        reference
    }

    /// The ETA update made under `key`, if any.
    pub fn find_eta_update(&self, key: &str) -> Option<String> {
        lock(&self.eta_updates).find(key)
    }

    /// How many times each system was asked to act for `order_id`, repeats of a key included.
    pub fn requests(&self, order_id: &str) -> Applications {
        let asked = |ledger: &Mutex<Ledger>| {
            let ledger = lock(ledger);
            ledger.asked.iter().filter(|o| *o == order_id).count()
        };
        Applications {
            rebookings: asked(&self.carrier),
            warehouse_notices: asked(&self.warehouse),
            eta_updates: asked(&self.eta_updates),
        }
    }

    /// How many times each action happened for `order_id`.
    pub fn applications(&self, order_id: &str) -> Applications {
        Applications {
            rebookings: lock(&self.carrier).for_order(order_id).len(),
            warehouse_notices: lock(&self.warehouse).for_order(order_id).len(),
            eta_updates: lock(&self.eta_updates).for_order(order_id).len(),
        }
    }
}
