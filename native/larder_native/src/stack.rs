//! A LIFO stack kept inline while small and spilled to the heap past `N`
//! entries: term walks replace recursion with it, without an allocation for
//! the shallow terms and expressions of the query hot path.

pub struct Stack<T, const N: usize> {
    inline: [Option<T>; N],
    len: usize,
    heap: Vec<T>,
}

impl<T, const N: usize> Stack<T, N> {
    pub fn new() -> Self {
        Stack {
            inline: std::array::from_fn(|_| None),
            len: 0,
            heap: Vec::new(),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len + self.heap.len()
    }

    pub fn push(&mut self, value: T) {
        // The heap only holds entries once the inline part is full, so the
        // newest entry is always on the heap when the heap is not empty.
        match self.inline.get_mut(self.len) {
            Some(slot) if self.heap.is_empty() => {
                *slot = Some(value);
                self.len += 1;
            }
            _ => self.heap.push(value),
        }
    }

    pub fn pop(&mut self) -> Option<T> {
        if let Some(value) = self.heap.pop() {
            return Some(value);
        }
        let index = self.len.checked_sub(1)?;
        self.len = index;
        self.inline.get_mut(index).and_then(Option::take)
    }

    pub fn last_mut(&mut self) -> Option<&mut T> {
        if !self.heap.is_empty() {
            return self.heap.last_mut();
        }
        let index = self.len.checked_sub(1)?;
        self.inline.get_mut(index).and_then(Option::as_mut)
    }
}
