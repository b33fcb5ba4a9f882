//! Issue 23: a plan's token positions and last-token rows, as slices tied
//! to the plan, for random mixes of prefill, chunked prefill and decode,
//! checked against the test's own bookkeeping.

mod common;

use common::{manager, Rng};

#[test]
fn positions_and_last_rows_follow_the_schedule() {
    let pool = manager(4, 512);
    let mut rng = Rng::new(23);
    let seqs: Vec<_> = (0..6).map(|_| pool.create_seq().unwrap()).collect();
    let mut total = vec![0u64; seqs.len()];
    let mut computed = vec![0u64; seqs.len()];
    for (i, &s) in seqs.iter().enumerate() {
        total[i] = rng.range(1, 30);
        pool.append(s, &rng.tokens(total[i] as usize)).unwrap();
    }
    for _ in 0..12 {
        let (mut sched, mut counts) = (Vec::new(), Vec::new());
        let (mut want_pos, mut want_last) = (Vec::<i64>::new(), Vec::<i64>::new());
        for (i, &s) in seqs.iter().enumerate() {
            if computed[i] == total[i] {
                pool.append(s, &rng.tokens(1)).unwrap(); // decode
                total[i] += 1;
            }
            if rng.range(0, 4) == 0 && !(sched.is_empty() && i + 1 == seqs.len()) {
                continue; // not scheduled this step
            }
            let left = total[i] - computed[i];
            let chunk = rng.range(1, left + 1);
            if chunk < left {
                // chunked prefill: the rest of the prompt waits
                pool.truncate(s, computed[i] + chunk).unwrap();
                total[i] = computed[i] + chunk;
            }
            sched.push(s);
            counts.push(chunk as u32);
            want_pos.extend(computed[i] as i64..(computed[i] + chunk) as i64);
            want_last.push(want_pos.len() as i64 - 1);
            computed[i] += chunk;
        }
        let batch = pool.prepare(&sched, &counts).unwrap();
        assert_eq!(batch.token_positions().unwrap(), &want_pos[..]);
        assert_eq!(batch.last_token_indices().unwrap(), &want_last[..]);
        // Zero-copy: the slice is the plan's own memory, the descriptor's.
        let t = batch.token_positions_tensor().unwrap();
        assert_eq!(t.shape(), &[want_pos.len() as i64]);
        assert_eq!(
            batch.token_positions().unwrap().as_ptr() as usize,
            t.data_ptr() as usize
        );
        let l = batch.last_token_indices_tensor().unwrap();
        assert_eq!(l.shape(), &[want_last.len() as i64]);
        batch.commit().unwrap();
    }
}
