//! [`Tenants`]: tenants' names as the scheduler's numbers. A request names its tenant (the
//! server's `user`); `--tenant-weights` lists the weighted ones, numbered from 1 in order;
//! other names get the next numbers as they first appear (weight 1), up to [`MAX_TENANTS`],
//! after which they share number 0 with the requests that name none (so a client sending
//! endless names cannot grow the table without bound). The tokens computed for the first
//! [`COUNTED_TENANTS`] numbers (the weighted tenants, then names as they appear) are counted
//! ([`Tenants::count`]) for `/metrics`: what the weights share.

use std::collections::HashMap;

/// Most distinct tenant names numbered.
pub const MAX_TENANTS: usize = 1 << 16;

/// Tenants whose computed tokens are counted (a bound on `/metrics`' series).
pub const COUNTED_TENANTS: usize = 64;

#[derive(Debug, Clone, Default)]
pub struct Tenants {
    ids: HashMap<String, u32>,
    /// The first [`COUNTED_TENANTS`] names (numbers 1..) and the tokens computed for each.
    counted: Vec<(String, u64)>,
}

impl Tenants {
    /// The weighted tenants, numbered 1.. in order; returns the scheduler's (number, weight)
    /// pairs too.
    pub fn new(weights: &[(String, u32)]) -> (Tenants, Vec<(u32, u32)>) {
        let mut t = Tenants::default();
        let mut pairs = Vec::with_capacity(weights.len());
        for (name, w) in weights {
            let id = t.id(Some(name));
            pairs.push((id, *w));
        }
        (t, pairs)
    }

    /// Counts `tokens` computed for tenant number `tenant` (see the module docs).
    pub fn count(&mut self, tenant: u32, tokens: usize) {
        if let Some(c) = (tenant as usize)
            .checked_sub(1)
            .and_then(|i| self.counted.get_mut(i))
        {
            c.1 += tokens as u64;
        }
    }

    /// The counted tenants' names and the tokens computed for each so far.
    pub fn computed(&self) -> &[(String, u64)] {
        &self.counted
    }

    /// The number of a tenant's name (0 for none).
    pub fn id(&mut self, name: Option<&str>) -> u32 {
        let Some(name) = name else {
            return 0;
        };
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        if self.ids.len() >= MAX_TENANTS {
            return 0;
        }
        let id = self.ids.len() as u32 + 1;
        self.ids.insert(name.to_string(), id);
        if self.counted.len() < COUNTED_TENANTS {
            self.counted.push((name.to_string(), 0));
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_stable_numbers_weighted_ones_first() {
        let (mut t, pairs) = Tenants::new(&[("a".into(), 3), ("b".into(), 1)]);
        assert_eq!(pairs, vec![(1, 3), (2, 1)]);
        assert_eq!(
            (t.id(Some("b")), t.id(Some("z")), t.id(Some("z"))),
            (2, 3, 3)
        );
        assert_eq!(t.id(None), 0);
        t.count(1, 5);
        t.count(2, 7);
        t.count(1, 1);
        // Named tenants are counted, weighted or not; unnamed ones are not.
        t.count(3, 100);
        t.count(0, 100);
        t.count(9, 100);
        assert_eq!(
            t.computed(),
            &[
                ("a".to_string(), 6),
                ("b".to_string(), 7),
                ("z".to_string(), 100)
            ]
        );
        // Past the bound, names are numbered but not counted.
        for i in 0..2 * COUNTED_TENANTS {
            let id = t.id(Some(&format!("t{i}")));
            t.count(id, 1);
        }
        assert_eq!(t.computed().len(), COUNTED_TENANTS);
    }
}
