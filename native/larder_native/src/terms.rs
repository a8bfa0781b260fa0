//! The map of term keys to postings, as snapshots share it: 4,096 hash
//! shards in 64 groups, each an `Arc`ed hash table. A writer's copy of the
//! map copies the 64 group pointers; a change copies the group and the
//! shard it falls in (each shard holds about terms / 4,096 entries), never
//! the other shards. A lookup is a hash, two indexed loads and one probe of
//! a flat hash table.

use crate::posting::Posting;
use std::collections::HashMap;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher};
use std::sync::Arc;

/// A small multiply-rotate hasher (as in rustc's FxHash, with a final mix):
/// keys are short encoded terms and the table is private, so SipHash's DoS
/// resistance buys nothing and costs a good part of a lookup.
#[derive(Default)]
pub struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            let word = u64::from_le_bytes(word);
            self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(K);
        }
        for &byte in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(K);
        }
    }

    /// Folds the high bits into the low ones: the multiply alone leaves the
    /// low bits depending on only a few bytes of each word.
    fn finish(&self) -> u64 {
        let mut h = self.0;
        h = (h ^ (h >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    }
}

type Hash = BuildHasherDefault<KeyHasher>;
type Shard = HashMap<Arc<[u8]>, Arc<Posting>, Hash>;

const GROUP_BITS: u32 = 6;
const SHARD_BITS: u32 = 6;
const GROUPS: usize = 1 << GROUP_BITS;
const SHARDS: usize = 1 << SHARD_BITS;

#[derive(Clone)]
struct Group {
    shards: [Option<Arc<Shard>>; SHARDS],
}

impl Default for Group {
    fn default() -> Self {
        Group {
            shards: std::array::from_fn(|_| None),
        }
    }
}

/// Term key -> posting. Cloning it is O(1) in the number of terms (64
/// pointer copies).
#[derive(Clone)]
pub struct Terms {
    groups: [Option<Arc<Group>>; GROUPS],
    len: usize,
}

impl Default for Terms {
    fn default() -> Self {
        Terms {
            groups: std::array::from_fn(|_| None),
            len: 0,
        }
    }
}

/// The group and shard of a key, from the top bits of its hash (the shard's
/// own table uses the low bits).
#[inline]
fn place(key: &[u8]) -> (usize, usize) {
    let h = Hash::default().hash_one(key);
    (
        (h >> (64 - GROUP_BITS)) as usize,
        ((h >> (64 - GROUP_BITS - SHARD_BITS)) as usize) & (SHARDS - 1),
    )
}

impl Terms {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, key: &[u8]) -> Option<&Arc<Posting>> {
        let (g, s) = place(key);
        self.groups[g].as_ref()?.shards[s].as_ref()?.get(key)
    }

    /// The shard `key` falls in, owned by this copy (copying the group and
    /// the shard if a snapshot shares them).
    fn shard_mut(&mut self, key: &[u8]) -> &mut Shard {
        let (g, s) = place(key);
        let group = Arc::make_mut(self.groups[g].get_or_insert_with(Default::default));
        Arc::make_mut(group.shards[s].get_or_insert_with(Default::default))
    }

    /// Entries a change to `key` copies when a snapshot shares its shard.
    pub fn shard_len(&self, key: &[u8]) -> usize {
        let (g, s) = place(key);
        self.groups[g]
            .as_ref()
            .and_then(|group| group.shards[s].as_ref())
            .map_or(0, |shard| shard.len())
    }

    /// The posting of `key`, owned by this copy; `make` builds it if absent.
    /// `None` only if the table lost the key it was just given.
    pub fn get_or_insert_with(
        &mut self,
        key: &[u8],
        make: impl FnOnce() -> Posting,
    ) -> Option<&mut Arc<Posting>> {
        let exists = self.get(key).is_some();
        if !exists {
            self.len += 1;
        }
        let shard = self.shard_mut(key);
        if !exists {
            shard.insert(Arc::from(key), Arc::new(make()));
        }
        shard.get_mut(key)
    }

    pub fn remove(&mut self, key: &[u8]) -> Option<Arc<Posting>> {
        let removed = self.shard_mut(key).remove(key);
        if removed.is_some() {
            self.len -= 1;
        }
        removed
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Arc<[u8]>, &Arc<Posting>)> {
        self.groups
            .iter()
            .flatten()
            .flat_map(|group| group.shards.iter().flatten())
            .flat_map(|shard| shard.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &Arc<Posting>> {
        self.iter().map(|(_, posting)| posting)
    }

    pub fn keys(&self) -> impl Iterator<Item = &Arc<[u8]>> {
        self.iter().map(|(key, _)| key)
    }
}
