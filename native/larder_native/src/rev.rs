//! The id-to-terms map of an index made with `reverse: true`: each term has
//! a small integer id (a tid) for as long as it has ids, and each row id maps
//! to the sorted tids of its terms. Row ids are grouped 64 to a leaf whose
//! tids sit in one flat array (no allocation per row id); leaves and the
//! tid-to-key table live in persistent tries that snapshots share, so a
//! write copies only the leaves it changes.

use crate::budget::Budget;
use crate::error::NativeError;
use crate::posting::LIVE_BYTES;
use crate::trie::Trie;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const SLOTS: usize = 64;

/// The tids of 64 consecutive row ids: slot `i`'s are
/// `tids[ends[i - 1]..ends[i]]`, sorted.
pub struct RowLeaf {
    ends: [u32; SLOTS],
    tids: Vec<u32>,
    /// This leaf's share of `LIVE_BYTES`.
    counted: usize,
}

impl Default for RowLeaf {
    fn default() -> Self {
        RowLeaf {
            ends: [0; SLOTS],
            tids: Vec::new(),
            counted: 0,
        }
    }
}

impl Clone for RowLeaf {
    fn clone(&self) -> Self {
        let mut leaf = RowLeaf {
            ends: self.ends,
            tids: self.tids.clone(),
            counted: 0,
        };
        leaf.recount();
        leaf
    }
}

impl Drop for RowLeaf {
    fn drop(&mut self) {
        LIVE_BYTES.fetch_sub(self.counted, Ordering::Relaxed);
    }
}

impl RowLeaf {
    fn bytes(&self) -> usize {
        std::mem::size_of::<RowLeaf>() + self.tids.capacity() * 4
    }

    fn recount(&mut self) {
        let size = self.bytes();
        LIVE_BYTES.fetch_add(size, Ordering::Relaxed);
        LIVE_BYTES.fetch_sub(self.counted, Ordering::Relaxed);
        self.counted = size;
    }

    fn range(&self, slot: usize) -> std::ops::Range<usize> {
        let start = if slot == 0 {
            0
        } else {
            self.ends[slot - 1] as usize
        };
        start..self.ends[slot] as usize
    }

    pub fn get(&self, slot: usize) -> &[u32] {
        self.tids.get(self.range(slot)).unwrap_or(&[])
    }

    fn set(&mut self, slot: usize, list: Vec<u32>) {
        let range = self.range(slot);
        let (old, new) = (range.len(), list.len());
        self.tids.splice(range, list);
        for end in &mut self.ends[slot..] {
            *end = (*end as usize + new - old) as u32;
        }
    }

    fn is_empty(&self) -> bool {
        self.tids.is_empty()
    }
}

/// The keys of 64 consecutive tids.
#[derive(Clone, Default)]
pub struct KeyLeaf {
    keys: Vec<Option<Arc<[u8]>>>,
}

/// One change to the map: row id, tid, the run of the batch it comes from
/// (a later run wins), and whether the row gains the term. A run changes a
/// (row id, tid) pair at most once.
pub type Change = (u32, u32, u32, bool);

#[derive(Clone, Default)]
pub struct Reverse {
    rows: Trie<RowLeaf>,
    keys: Trie<KeyLeaf>,
    /// The lowest tid never handed out.
    next: u32,
    /// Tids of terms that lost their last id, to hand out again.
    free: Arc<Vec<u32>>,
}

impl Reverse {
    /// A tid for a new term whose key is `key`.
    pub fn intern(&mut self, key: &Arc<[u8]>) -> Result<u32, NativeError> {
        let tid = match Arc::make_mut(&mut self.free).pop() {
            Some(tid) => tid,
            None => {
                let tid = self.next;
                self.next = self.next.checked_add(1).ok_or(NativeError::Internal)?;
                tid
            }
        };
        let (leaf, slot) = self.keys.leaf_mut(tid);
        if leaf.keys.len() < SLOTS {
            leaf.keys.resize(SLOTS, None);
        }
        leaf.keys[slot] = Some(key.clone());
        Ok(tid)
    }

    /// Forgets the term of `tids` (each lost its last id) and frees them.
    pub fn release(&mut self, tids: &[u32]) {
        for &tid in tids {
            let (leaf, slot) = self.keys.leaf_mut(tid);
            leaf.keys[slot] = None;
            if leaf.keys.iter().all(Option::is_none) {
                self.keys.prune(tid);
            }
        }
        if !tids.is_empty() {
            Arc::make_mut(&mut self.free).extend_from_slice(tids);
        }
    }

    /// Sets the leaf of the 64 row ids from `base` (a multiple of 64) at
    /// once, for a map being built from scratch: slot `i`'s tids are
    /// `tids[ends[i - 1]..ends[i]]`, each slot's sorted. An empty leaf is
    /// not stored.
    pub fn set_leaf(&mut self, base: u32, ends: [u32; SLOTS], tids: Vec<u32>) {
        if tids.is_empty() {
            return;
        }
        let (leaf, _) = self.rows.leaf_mut(base);
        leaf.ends = ends;
        leaf.tids = tids;
        leaf.recount();
    }

    /// The keys of the terms row `id` is in.
    pub fn terms(&self, id: u32) -> impl Iterator<Item = &Arc<[u8]>> {
        let tids = self
            .rows
            .leaf(id)
            .map_or(&[][..], |(leaf, slot)| leaf.get(slot));
        tids.iter().filter_map(|&tid| {
            let (leaf, slot) = self.keys.leaf(tid)?;
            leaf.keys.get(slot)?.as_ref()
        })
    }

    /// Applies `changes` (in the order the batch made them: for a row and a
    /// term, the last change wins). Each changed row's list is merged once.
    pub fn apply(
        &mut self,
        mut changes: Vec<Change>,
        budget: &mut Budget,
    ) -> Result<(), NativeError> {
        // One u128 comparison per step instead of three.
        changes.sort_unstable_by_key(|&(id, tid, seq, _)| {
            (u128::from(id) << 64) | (u128::from(tid) << 32) | u128::from(seq)
        });
        let mut emptied = Vec::new();
        let mut add = Vec::new();
        let mut remove = Vec::new();
        let mut rest = changes.as_slice();
        while let Some(&(id, ..)) = rest.first() {
            let n = rest.iter().position(|c| c.0 != id).unwrap_or(rest.len());
            let (group, tail) = rest.split_at(n);
            rest = tail;
            add.clear();
            remove.clear();
            for (i, &(_, tid, _, gain)) in group.iter().enumerate() {
                let last = group.get(i + 1).is_none_or(|next| next.1 != tid);
                if last {
                    if gain {
                        add.push(tid);
                    } else {
                        remove.push(tid);
                    }
                }
            }
            let (leaf, slot) = self.rows.leaf_mut(id);
            let old = leaf.get(slot);
            budget.spend(1 + (old.len() + add.len()) as u64 / 16 + leaf.tids.len() as u64 / 256)?;
            let list = merge(old, &add, &remove);
            leaf.set(slot, list);
            leaf.recount();
            if leaf.is_empty() {
                emptied.push(id);
            }
        }
        for id in emptied {
            if self.rows.leaf(id).is_some_and(|(leaf, _)| leaf.is_empty()) {
                self.rows.prune(id);
            }
        }
        Ok(())
    }

    /// Bytes the map holds: its leaves, a share of the inner nodes, the
    /// key table and the free list. O(leaves).
    pub fn bytes(&self) -> usize {
        let mut bytes = 0;
        self.rows
            .for_each_leaf(|_, leaf| bytes += leaf.bytes() + 24);
        self.keys
            .for_each_leaf(|_, leaf| bytes += 64 + leaf.keys.capacity() * 8);
        bytes + self.free.capacity() * 4
    }
}

/// `(old - remove) | add`, all sorted.
fn merge(old: &[u32], add: &[u32], remove: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(old.len() + add.len());
    let (mut a, mut r) = (add.iter().peekable(), remove.iter().peekable());
    for &tid in old {
        while let Some(&&next) = a.peek() {
            if next >= tid {
                break;
            }
            out.push(next);
            a.next();
        }
        while r.next_if(|&&x| x < tid).is_some() {}
        if r.next_if(|&&x| x == tid).is_some() {
            a.next_if(|&&x| x == tid);
            continue;
        }
        a.next_if(|&&x| x == tid);
        out.push(tid);
    }
    out.extend(a);
    out
}
