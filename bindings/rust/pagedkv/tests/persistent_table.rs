//! Persistent page tables (`prepare_persistent_on`): every row of the
//! padded table equals the CSR plan's row over the same state (the null
//! block past it) and the other arrays are equal, through decode steps,
//! frees and new sequences; bad input fails as `prepare` does.

mod common;

use common::*;
use pagedkv::{ErrorKind, Pool, SeqId, Stream};

fn new_seq(pool: &Pool, seed: u32) -> SeqId {
    let s = pool.create_seq().unwrap();
    let n = 1 + (seed.wrapping_mul(7919) % 20) as usize;
    let toks: Vec<i32> = (0..n)
        .map(|k| ((seed as usize % 1000 * 31 + k * 17) % 50) as i32)
        .collect();
    pool.append(s, &toks).unwrap();
    s
}

#[test]
fn persistent_rows_equal_csr_rows() {
    let pool = manager(4, 2000);
    let mut seqs: Vec<SeqId> = (0..6).map(|i| new_seq(&pool, i)).collect();
    let mut seed = 100u32;
    for step in 0..60u32 {
        seed = seed.wrapping_mul(1103515245).wrapping_add(12345);
        match (seed >> 16) % 10 {
            0..=6 => {
                let toks: Vec<i32> = (0..seqs.len() as i32)
                    .map(|i| (i + step as i32) % 50)
                    .collect();
                pool.append_batch(&seqs, &toks).unwrap();
            }
            7 => {
                let i = (seed >> 8) as usize % seqs.len();
                pool.free_seq(seqs[i]).unwrap();
                seqs[i] = new_seq(&pool, seed);
            }
            _ => seqs.push(new_seq(&pool, seed)),
        }
        let q: Vec<u32> = seqs
            .iter()
            .map(|s| {
                let i = pool.seq_info(*s).unwrap();
                (i.num_tokens - i.num_computed_tokens).max(1) as u32
            })
            .collect();
        let pers = pool
            .prepare_persistent_on(&seqs, &q, Stream::DEFAULT)
            .unwrap();
        let csr = pool.prepare(&seqs, &q).unwrap();
        assert_eq!(pers.slot_mapping().unwrap(), csr.slot_mapping().unwrap());
        assert_eq!(pers.query_indptr().unwrap(), csr.query_indptr().unwrap());
        assert_eq!(pers.last_page_len().unwrap(), csr.last_page_len().unwrap());
        assert_eq!(pers.context_lens().unwrap(), csr.context_lens().unwrap());
        let (pptr, pidx) = (pers.page_indptr().unwrap(), pers.page_indices().unwrap());
        let (cptr, cidx) = (csr.page_indptr().unwrap(), csr.page_indices().unwrap());
        let stride = pptr[1] as usize;
        assert_eq!(pidx.len(), stride * seqs.len(), "step {step}");
        for i in 0..seqs.len() {
            assert_eq!(pptr[i] as usize, i * stride, "step {step}");
            let row = &cidx[cptr[i] as usize..cptr[i + 1] as usize];
            for j in 0..stride {
                let want = if j < row.len() { row[j] } else { 0 };
                assert_eq!(pidx[i * stride + j], want, "step {step} row {i} page {j}");
            }
        }
        csr.abort().unwrap();
        pers.commit().unwrap();
    }
    let zero = vec![0u32; seqs.len()];
    let err = pool
        .prepare_persistent_on(&seqs, &zero, Stream::DEFAULT)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.message().contains("query_counts[0]"),
        "{}",
        err.message()
    );
    pool.validate().unwrap();
}
