//! The CPU backend's activation buffers, kept from layer to layer and step to step: a step
//! takes its buffers here (`Cpu::acts`) and gives them back when done (`Cpu::recycle`), so a
//! step neither allocates nor faults in fresh zeroed pages. A buffer handed out keeps its old
//! contents where it already had them (every operation writes its whole output), so only
//! growth is zero-filled.

/// At most this many buffers are kept (a step uses about ten).
const MAX_KEPT: usize = 16;

/// Buffers given back, for reuse.
#[derive(Default)]
pub struct Arena {
    spare: Vec<Vec<f32>>,
}

impl Arena {
    /// A buffer of `n` floats: the smallest spare one that holds `n` without growing, else the
    /// largest spare one grown, else a new one. Its contents are unspecified.
    pub fn take(&mut self, n: usize) -> Vec<f32> {
        let fits = self
            .spare
            .iter()
            .enumerate()
            .filter(|(_, v)| v.capacity() >= n)
            .min_by_key(|(_, v)| v.capacity())
            .map(|(i, _)| i);
        let largest = || (0..self.spare.len()).max_by_key(|&i| self.spare[i].capacity());
        let mut v = match fits.or_else(largest) {
            Some(i) => self.spare.swap_remove(i),
            None => Vec::new(),
        };
        if v.len() >= n {
            v.truncate(n);
        } else {
            v.resize(n, 0.0);
        }
        v
    }

    /// Keeps `v` for a later [`Arena::take`] (dropping the smallest spare one past the limit).
    pub fn give(&mut self, v: Vec<f32>) {
        self.spare.push(v);
        if self.spare.len() > MAX_KEPT {
            let smallest = (0..self.spare.len())
                .min_by_key(|&i| self.spare[i].capacity())
                .expect("not empty");
            self.spare.swap_remove(smallest);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Arena;

    #[test]
    fn buffers_come_back_with_the_asked_length() {
        let mut a = Arena::default();
        let v = a.take(100);
        assert_eq!(v.len(), 100);
        let p = v.as_ptr();
        a.give(v);
        // The same allocation, shortened; then grown within its capacity.
        let v = a.take(40);
        assert_eq!((v.len(), v.as_ptr()), (40, p));
        a.give(v);
        let v = a.take(100);
        assert_eq!((v.len(), v.as_ptr()), (100, p));
        // A second buffer while the first is out is another allocation.
        let w = a.take(10);
        assert_ne!(w.as_ptr(), p);
        assert_eq!(w.len(), 10);
    }

    #[test]
    fn the_smallest_buffer_that_fits_is_chosen() {
        let mut a = Arena::default();
        let (big, small) = (a.take(1000), a.take(10));
        let small_ptr = small.as_ptr();
        a.give(big);
        a.give(small);
        let got = a.take(8);
        assert_eq!(got.as_ptr(), small_ptr);
    }
}
