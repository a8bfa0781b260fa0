//! A persistent array indexed by `u32`: a radix trie of fanout 64 over
//! `Arc`ed nodes, so snapshots share it and a writer's change to one slot
//! copies the (at most six) nodes on its path, never the rest. Leaves cover
//! 64 consecutive indexes. Walks are loops over the fixed depth.

use std::sync::Arc;

const BITS: u32 = 6;
const FAN: usize = 1 << BITS;
/// Levels of inner nodes above the leaves: 6 bits each, with the leaves' 6,
/// cover 36 >= 32 bits.
const LEVELS: u32 = 5;

enum Node<L> {
    Inner(Box<[Option<Arc<Node<L>>>; FAN]>),
    Leaf(L),
}

impl<L: Clone> Clone for Node<L> {
    fn clone(&self) -> Self {
        match self {
            Node::Inner(children) => Node::Inner(children.clone()),
            Node::Leaf(leaf) => Node::Leaf(leaf.clone()),
        }
    }
}

/// Index of the leaf slot for `at`, and of each inner level's child.
#[inline]
fn digit(at: u32, level: u32) -> usize {
    ((u64::from(at) >> (BITS * level)) as usize) & (FAN - 1)
}

pub struct Trie<L> {
    root: Option<Arc<Node<L>>>,
}

impl<L> Clone for Trie<L> {
    fn clone(&self) -> Self {
        Trie {
            root: self.root.clone(),
        }
    }
}

impl<L> Default for Trie<L> {
    fn default() -> Self {
        Trie { root: None }
    }
}

impl<L: Clone + Default> Trie<L> {
    /// The leaf holding index `at`, and `at`'s slot in it.
    pub fn leaf(&self, at: u32) -> Option<(&L, usize)> {
        let mut node = self.root.as_deref()?;
        let mut level = LEVELS;
        loop {
            match node {
                Node::Leaf(leaf) => return Some((leaf, digit(at, 0))),
                Node::Inner(children) => {
                    node = children[digit(at, level)].as_deref()?;
                    level -= 1;
                }
            }
        }
    }

    /// The leaf holding index `at`, owned by this copy (copying each shared
    /// node on the way, creating missing ones), and `at`'s slot in it.
    pub fn leaf_mut(&mut self, at: u32) -> (&mut L, usize) {
        let mut slot = &mut self.root;
        let mut level = LEVELS;
        loop {
            let node = slot.get_or_insert_with(|| {
                Arc::new(if level == 0 {
                    Node::Leaf(L::default())
                } else {
                    Node::Inner(Box::new(std::array::from_fn(|_| None)))
                })
            });
            match Arc::make_mut(node) {
                Node::Leaf(leaf) => return (leaf, digit(at, 0)),
                Node::Inner(children) => {
                    slot = &mut children[digit(at, level)];
                    level = level.saturating_sub(1);
                }
            }
        }
    }

    /// Drops the leaf holding `at` (when it became empty) and the inner
    /// nodes left without children, so memory returns.
    pub fn prune(&mut self, at: u32) {
        let mut node = self.root.as_deref();
        let mut level = LEVELS;
        // Deepest level whose node has another child besides the path: the
        // cut goes below it.
        let mut keep_above: Option<u32> = None;
        while let Some(Node::Inner(children)) = node {
            let d = digit(at, level);
            if children
                .iter()
                .enumerate()
                .any(|(i, child)| i != d && child.is_some())
            {
                keep_above = Some(level);
            }
            node = children[d].as_deref();
            level = level.saturating_sub(1);
        }
        let Some(keep) = keep_above else {
            self.root = None;
            return;
        };
        let mut slot = &mut self.root;
        let mut level = LEVELS;
        while let Some(node) = slot {
            let Node::Inner(children) = Arc::make_mut(node) else {
                return;
            };
            if level == keep {
                children[digit(at, level)] = None;
                return;
            }
            slot = &mut children[digit(at, level)];
            level = level.saturating_sub(1);
        }
    }

    /// Every leaf, in index order, with the index of its first slot.
    /// Iterative (explicit stack of at most `LEVELS + 1` frames).
    pub fn for_each_leaf(&self, mut f: impl FnMut(u32, &L)) {
        let mut stack: Vec<(&Node<L>, u64)> = Vec::with_capacity(FAN * 2);
        if let Some(root) = self.root.as_deref() {
            stack.push((root, 0));
        }
        let mut levels: Vec<u32> = vec![LEVELS];
        while let (Some((node, base)), Some(level)) = (stack.pop(), levels.pop()) {
            match node {
                Node::Leaf(leaf) => f(base as u32, leaf),
                Node::Inner(children) => {
                    for (i, child) in children.iter().enumerate().rev() {
                        if let Some(child) = child.as_deref() {
                            stack.push((child, base | ((i as u64) << (BITS * level))));
                            levels.push(level.saturating_sub(1));
                        }
                    }
                }
            }
        }
    }
}
