//! The pool of KV caches kept aside: conversations' caches that are not the model's own, each with
//! the token ids it holds, within a byte budget, evicted least-recently-used.
//!
//! The engine asks for the entry whose ids the new prompt extends the longest (the whole entry is
//! a strict prefix of the prompt: a cache is reused whole or not at all), takes it out and
//! restores it into the model, and parks the model's previous cache here. An entry's last use is
//! when it was parked: taking one out removes it.

/// One kept cache.
#[derive(Debug)]
struct Entry<S> {
    ids: Vec<u32>,
    snapshot: S,
    bytes: u64,
    /// When it was parked (a counter): the smallest is evicted first.
    used: u64,
}

/// Caches kept aside, at most `budget` bytes of them.
#[derive(Debug)]
pub struct Pool<S> {
    entries: Vec<Entry<S>>,
    budget: u64,
    bytes: u64,
    clock: u64,
}

impl<S> Pool<S> {
    pub fn new(budget: u64) -> Self {
        Pool { entries: Vec::new(), budget, bytes: 0, clock: 0 }
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Bytes the kept caches hold.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The entry whose ids `prompt` extends the longest (strictly: at least one new token):
    /// its index and the number of ids it holds.
    pub fn longest_prefix(&self, prompt: &[u32]) -> Option<(usize, usize)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| extends(prompt, &e.ids))
            .max_by_key(|(_, e)| e.ids.len())
            .map(|(i, e)| (i, e.ids.len()))
    }

    /// Takes entry `index` out: its ids and snapshot.
    pub fn take(&mut self, index: usize) -> (Vec<u32>, S) {
        let e = self.entries.swap_remove(index);
        self.bytes -= e.bytes;
        (e.ids, e.snapshot)
    }

    /// Keeps `snapshot` of `ids` (in place of an entry with the same ids), then evicts the least
    /// recently used entries until the pool is within its budget. An entry over the whole budget
    /// is not kept (and evicts nothing else). Returns the number evicted, that one included.
    pub fn park(&mut self, ids: Vec<u32>, snapshot: S, bytes: u64) -> usize {
        if let Some(i) = self.entries.iter().position(|e| e.ids == ids) {
            self.take(i);
        }
        if bytes > self.budget {
            return 1;
        }
        self.clock += 1;
        self.entries.push(Entry { ids, snapshot, bytes, used: self.clock });
        self.bytes += bytes;
        let mut evicted = 0;
        while self.bytes > self.budget {
            let Some(oldest) = self.entries.iter().enumerate().min_by_key(|(_, e)| e.used).map(|(i, _)| i) else { break };
            self.take(oldest);
            evicted += 1;
        }
        evicted
    }
}

/// `prompt` extends `ids`: they are a strict, non-empty prefix of it.
pub fn extends(prompt: &[u32], ids: &[u32]) -> bool {
    !ids.is_empty() && ids.len() < prompt.len() && prompt.starts_with(ids)
}

/// How many leading ids `prompt` and `ids` share: the part of a cache holding `ids` that a cache
/// truncated to a prefix can give `prompt` (reads: the system text before a new state).
pub fn shared_prefix(prompt: &[u32], ids: &[u32]) -> usize {
    prompt.iter().zip(ids).take_while(|(a, b)| a == b).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_extended_entry_is_found_and_taken_out() {
        let mut pool = Pool::new(1000);
        pool.park(vec![1, 2], "short", 10);
        pool.park(vec![1, 2, 3, 4], "long", 10);
        pool.park(vec![9, 9, 9], "other", 10);
        assert_eq!(pool.longest_prefix(&[1, 2, 3, 4, 5]), Some((1, 4)));
        assert_eq!(pool.longest_prefix(&[1, 2, 3]).map(|(_, n)| n), Some(2), "the longer one is not a prefix");
        assert_eq!(pool.longest_prefix(&[1, 2, 3, 4]).map(|(_, n)| n), Some(2), "an entry equal to the prompt is not extended");
        assert_eq!(pool.longest_prefix(&[5]), None);
        let (i, _) = pool.longest_prefix(&[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(pool.take(i), (vec![1, 2, 3, 4], "long"));
        assert_eq!((pool.len(), pool.bytes()), (2, 20));
    }

    #[test]
    fn a_shared_prefix_is_the_run_of_equal_leading_ids() {
        assert_eq!(shared_prefix(&[1, 2, 3, 4], &[1, 2, 9]), 2);
        assert_eq!(shared_prefix(&[1, 2], &[1, 2, 3]), 2, "a prompt inside the cached ids");
        assert_eq!(shared_prefix(&[5, 2], &[1, 2]), 0);
        assert_eq!(shared_prefix(&[], &[1]), 0);
    }

    #[test]
    fn the_least_recently_parked_entries_go_first_when_over_budget() {
        let mut pool = Pool::new(25);
        assert_eq!(pool.park(vec![1], 'a', 10), 0);
        assert_eq!(pool.park(vec![2], 'b', 10), 0);
        // Parking `a` again makes it the most recent (it replaces the old entry).
        assert_eq!(pool.park(vec![1], 'a', 10), 0);
        assert_eq!(pool.park(vec![3], 'c', 10), 1);
        assert!(pool.longest_prefix(&[2, 0]).is_none(), "b was the least recently used");
        assert!(pool.longest_prefix(&[1, 0]).is_some() && pool.longest_prefix(&[3, 0]).is_some());
        assert_eq!((pool.len(), pool.bytes()), (2, 20));
        // An entry over the whole budget is not kept, and the others stay.
        assert_eq!(pool.park(vec![4], 'd', 30), 1);
        assert_eq!((pool.len(), pool.bytes()), (2, 20));
        let mut off = Pool::new(0);
        assert_eq!(off.park(vec![1], 'a', 1), 1);
        assert_eq!(off.len(), 0);
    }
}
