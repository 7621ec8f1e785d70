//! [`Tenants`]: tenants' names as the scheduler's numbers. A request names its tenant (the
//! server's `user`); `--tenant-weights` lists the weighted ones, numbered from 1 in order;
//! other names get the next numbers as they first appear (weight 1), up to [`MAX_TENANTS`],
//! after which they share number 0 with the requests that name none (so a client sending
//! endless names cannot grow the table without bound).

use std::collections::HashMap;

/// Most distinct tenant names numbered.
pub const MAX_TENANTS: usize = 1 << 16;

#[derive(Debug, Clone, Default)]
pub struct Tenants {
    ids: HashMap<String, u32>,
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
    }
}
