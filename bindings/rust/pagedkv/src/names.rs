//! The library's messages name its C functions, arguments and option fields
//! (`pkv_batch_prepare: num_seqs is 0`, `pkv_pool_create: opts->block_size
//! 2000 is outside [1, 1024]`, `k_scales[0] = -1 ...`, `dtype 1`). This
//! module rewrites them into the names the Rust API gives them
//! (`Pool::prepare: seqs.len() is 0`, `Pool::new: PoolOptions::block_size
//! 2000 ...`, `DType::F32`), per C function, so that an error says what to
//! change in the Rust call. [`Error::c_message`](crate::Error::c_message)
//! keeps the library's own text.
//!
//! Style: a field of an options struct is `Struct::field`
//! (`PoolOptions::block_size`, `SeqOptions::mm_items[1]`), a slice argument's
//! count is `arg.len()`, a method is `Type::method`.

use crate::types::DType;

/// A C name and its Rust name. A key ending in `*` (`opts->*`) matches
/// every name with that prefix, and the value's `*` takes the rest. A key
/// with `[]` (`groups[].flags`) matches any index, which the value keeps.
pub(crate) type Renames = &'static [(&'static str, &'static str)];

/// How one C function's messages are shown: the Rust method reported and
/// the names rewritten.
#[derive(Clone, Copy)]
pub(crate) struct Names {
    pub(crate) op: &'static str,
    pub(crate) args: Renames,
}

const POOL_FIELDS: Renames = &[
    ("device_type", "PoolOptions::device"),
    ("device_id", "PoolOptions::device"),
    ("num_kv_scales", "PoolOptions::k_scales.len()"),
    (
        "strict_key_domains",
        "PoolOptions::strict_key_domains/vllm_tagged_keys",
    ),
];

// The fields of pkv_pool_options, named bare by the pool's own checks.
const POOL_FIELD_NAMES: &[&str] = &[
    "block_size",
    "num_blocks",
    "memory_budget_bytes",
    "hash_algo",
    "enable_prefix_caching",
    "hash_seed",
    "sliding_window",
    "enable_events",
    "max_events",
    "num_layers",
    "num_kv_heads",
    "head_dim",
    "dtype",
    "num_threads",
    "kv_scale_granularity",
    "k_scales",
    "v_scales",
    "enable_partial_reuse",
    "enable_retention",
    "max_pinned_blocks",
    "kv_layout",
    "kv_lora_rank",
    "qk_rope_head_dim",
];

const POOL_CREATE: Renames = &[
    ("opts->device_type", "PoolOptions::device"),
    ("opts->device_id", "PoolOptions::device"),
    ("opts->num_kv_scales", "PoolOptions::k_scales.len()"),
    (
        "opts->strict_key_domains",
        "PoolOptions::strict_key_domains/vllm_tagged_keys",
    ),
    ("opts->*", "PoolOptions::*"),
];

const POOL_CREATE_GROUPS: Renames = &[
    (
        "base->strict_key_domains",
        "PoolOptions::strict_key_domains/vllm_tagged_keys",
    ),
    ("base->*", "PoolOptions::*"),
    ("groups[].sliding_window", "groups[].kind.window"),
    ("groups[].kv_lora_rank", "groups[].kind.kv_lora_rank"),
    ("groups[].rope_dim", "groups[].kind.rope_dim"),
    ("groups[].state_bytes", "groups[].kind.state_bytes"),
    ("groups[].flags", "groups[].snapshot_every_block"),
    ("num_groups", "groups.len()"),
];

const SEQ_OPTS: Renames = &[
    ("opts->num_mm_items", "SeqOptions::mm_items.len()"),
    ("opts->*", "SeqOptions::*"),
    ("num_tokens", "tokens.len()"),
    ("num_hashes", "hashes.len()"),
];

const TOKENS: Renames = &[
    ("num_tokens", "tokens.len()"),
    ("num_hashes", "hashes.len()"),
];
const SEQS: Renames = &[("num_seqs", "seqs.len()")];

/// The safe API's names for a C function's messages: the method reporting
/// them, and the names to rewrite. `None` for a function the safe API does
/// not call (its message stays as the library wrote it).
pub(crate) fn names_of(c_fn: &str) -> Option<Names> {
    let n = |op, args| Some(Names { op, args });
    match c_fn {
        "pkv_pool_create" => n("Pool::new", POOL_CREATE),
        "pkv_pool_create_groups" => n("Pool::with_groups", POOL_CREATE_GROUPS),
        "pkv_pool_get_options" => n("Pool::options", &[]),
        "pkv_pool_bytes_per_block" => n("Pool::bytes_per_block", &[]),
        "pkv_pool_get_kv_scales" => n("Pool::kv_scales", &[]),
        "pkv_pool_set_kv_scales" => n(
            "Pool::set_kv_scales",
            &[
                ("num_scales", "k_scales.len()"),
                ("num_layers", "PoolOptions::num_layers"),
                ("num_kv_heads", "PoolOptions::num_kv_heads"),
            ],
        ),
        "pkv_seq_create" => n("Pool::create_seq", SEQ_OPTS),
        "pkv_seq_match_prefix" => n("Pool::match_prefix", TOKENS),
        "pkv_seq_match_prefix_partial" => n(
            "Pool::match_prefix_partial",
            &[
                ("num_tokens", "tokens.len()"),
                ("enable_partial_reuse", "PoolOptions::enable_partial_reuse"),
            ],
        ),
        "pkv_seq_match_prefix_hashes" => n("Pool::match_prefix_hashes", TOKENS),
        "pkv_seq_set_retention" => n(
            "Pool::set_retention",
            &[
                ("num_ranges", "ranges.len()"),
                ("enable_retention", "PoolOptions::enable_retention"),
                ("max_pinned_blocks", "PoolOptions::max_pinned_blocks"),
            ],
        ),
        "pkv_seq_append" => n("Pool::append", TOKENS),
        "pkv_seq_blocks_needed" => n("Pool::blocks_needed", &[]),
        "pkv_seq_fork" => n("Pool::fork", &[]),
        "pkv_seq_truncate" => n("Pool::truncate", &[]),
        "pkv_seq_reserve" => n("Pool::reserve", &[]),
        "pkv_seq_free" => n("Pool::free_seq", &[]),
        "pkv_seq_append_batch" => n("Pool::append_batch", SEQS),
        "pkv_seq_free_batch" => n("Pool::free_batch", SEQS),
        "pkv_seq_admit" => n("Pool::admit", SEQ_OPTS),
        "pkv_seq_admit_hashes" => n("Pool::admit_hashes", SEQ_OPTS),
        "pkv_seq_admit_tiered" => n("Pool::admit_tiered", SEQ_OPTS),
        "pkv_seq_get_info" => n("Pool::seq_info", &[]),
        "pkv_seq_get_block_table" => n("Pool::block_table", &[]),
        "pkv_seq_get_block_hashes" => n("Pool::block_hashes", &[]),
        "pkv_pool_get_stats" => n("Pool::stats", &[]),
        "pkv_pool_get_priority_counts" => n("Pool::priority_counts", &[]),
        "pkv_pool_set_clock" => n("Pool::set_clock", &[]),
        "pkv_pool_drain_events" => n("Pool::drain_events", &[]),
        "pkv_pool_drain_events_v2" => n("drain_events_v2", &[]),
        "pkv_pool_reset_prefix_cache" => n("Pool::reset_prefix_cache", &[]),
        "pkv_pool_validate" => n("Pool::validate", &[]),
        "pkv_pool_kv_tensor" => n(
            "Pool::kv_tensor",
            &[("PKV_KV_KEY", "Kv::Key"), ("PKV_KV_VALUE", "Kv::Value")],
        ),
        "pkv_pool_copy_blocks" => n("Pool::copy_blocks", &[("num_pairs", "src.len()")]),
        "pkv_pool_swap_blocks" => n(
            "Pool::swap_blocks_raw",
            &[("num_blocks", "blocks.len()"), ("host_buffer", "host")],
        ),
        "pkv_batch_prepare" | "pkv_batch_prepare_ex" => n("Pool::prepare", SEQS),
        "pkv_batch_prepare_decode" => n("Pool::prepare_decode", SEQS),
        "pkv_batch_commit" => n("Batch::commit", &[]),
        "pkv_batch_abort" => n("Batch::abort", &[]),
        "pkv_batch_get_info" => n("Batch::info", &[]),
        "pkv_batch_plan_tensor" => n("Batch::plan_tensor", &[]),
        "pkv_batch_plan_tensor_group" => n("Batch::plan_group_tensor", &[]),
        "pkv_batch_token_positions" => n("Batch::token_positions", &[]),
        "pkv_batch_last_token_indices" => n("Batch::last_token_indices", &[]),
        "pkv_cache_write" => n("Batch::cache_write", &[]),
        "pkv_attention_forward" => n(
            "Batch::attention_forward",
            &[("params->*", "AttentionParams::*")],
        ),
        "pkv_mla_cache_write" => n("Batch::mla_cache_write", &[]),
        "pkv_mla_attention" => n(
            "Batch::mla_attention",
            &[("params->softmax_scale", "softmax_scale")],
        ),
        "pkv_hash_prefix" => n(
            "hash_prefix",
            &[
                ("opts->num_mm_items", "HashOptions::mm_items.len()"),
                (
                    "opts->strict_key_domains",
                    "HashOptions::strict_key_domains/vllm_tagged_keys",
                ),
                ("opts->*", "HashOptions::*"),
                ("num_tokens", "tokens.len()"),
            ],
        ),
        "pkv_hash_root" => n("hash_root", &[]),
        "pkv_pool_num_groups" => n("Pool::num_groups", &[]),
        "pkv_pool_group_of_layer" => n("Pool::group_of_layer", &[]),
        "pkv_seq_group_block_table" => n("Pool::group_block_table", &[]),
        "pkv_pool_group_stats" => n("Pool::group_stats", &[]),
        "pkv_pool_group_take_copies" => n("Pool::take_copies", &[]),
        "pkv_pool_attach_tiers" => n(
            "Pool::attach_tiers",
            &[
                ("opts->*", "TierOptions::*"),
                ("host_bytes", "TierOptions::host_bytes"),
                ("file_dir", "TierOptions::file_dir"),
                ("file_bytes", "TierOptions::file_bytes"),
            ],
        ),
        "pkv_pool_get_tier_stats" => n("Pool::tier_stats", &[]),
        "pkv_pool_flush_tiers" => n("Pool::flush_tiers", &[]),
        "pkv_seq_match_prefix_tiered" => n("Pool::match_prefix_tiered", TOKENS),
        "pkv_seq_match_prefix_hashes_tiered" => n("Pool::match_prefix_hashes_tiered", TOKENS),
        "pkv_event_publisher_create" => n(
            "EventPublisher::new",
            &[
                ("opts->*", "PublisherOptions::*"),
                ("enable_events", "PoolOptions::enable_events"),
            ],
        ),
        "pkv_event_publisher_publish" => n("EventPublisher::publish", &[]),
        "pkv_event_publisher_get_stats" => n("EventPublisher::stats", &[]),
        "pkv_event_publisher_endpoint" => n("EventPublisher::endpoint", &[]),
        "pkv_transfer_engine_create" => {
            n("TransferEngine::new", &[("opts->*", "TransferOptions::*")])
        }
        "pkv_transfer_engine_progress" => n("TransferEngine::progress", &[]),
        "pkv_transfer_export" | "pkv_transfer_export_descriptor" => {
            n("TransferEngine::export", &[])
        }
        "pkv_transfer_export_release" => n("TransferEngine::release_export", &[]),
        "pkv_transfer_engine_num_exports" => n("TransferEngine::num_exports", &[]),
        "pkv_transfer_import" => n("TransferEngine::import", SEQ_OPTS),
        "pkv_transfer_poll" => n("Transfer::poll", &[]),
        "pkv_transfer_cancel" => n("Transfer::cancel", &[]),
        "pkv_transfer_bytes" => n("Transfer::bytes", &[]),
        _ => None,
    }
}

/// The library's message `msg` (`"pkv_fn: text"`) in the safe API's names:
/// the Rust method `op` (the C function's own, or the caller's override)
/// instead of the C function, and `args` (or the C function's table)
/// rewritten. A message of a function the table does not know is returned
/// unchanged.
pub(crate) fn rust_message(msg: &str, op: Option<&str>, extra: Renames) -> String {
    let Some((c_fn, text)) = msg.split_once(": ") else {
        return msg.to_string();
    };
    if !c_fn.starts_with("pkv_") || c_fn.contains(' ') {
        return msg.to_string();
    }
    let Some(names) = names_of(c_fn) else {
        return msg.to_string();
    };
    let pool_fields = c_fn == "pkv_pool_create";
    let out = rewrite(text, extra, names.args, pool_fields);
    format!("{}: {}", op.unwrap_or(names.op), out)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

// The name at the start of s: an identifier, `a->b` optionally, then any
// `[digits]` and `.field` parts. Returns its length in bytes.
fn name_len(s: &str) -> usize {
    let b = s.as_bytes();
    let ident = |mut i: usize| {
        let start = i;
        while i < b.len() && is_ident(b[i] as char) {
            i += 1;
        }
        (i > start).then_some(i)
    };
    let Some(mut i) = ident(0) else { return 0 };
    if s[i..].starts_with("->") {
        if let Some(j) = ident(i + 2) {
            i = j;
        }
    }
    loop {
        if b.get(i) == Some(&b'[') {
            let mut j = i + 1;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j > i + 1 && b.get(j) == Some(&b']') {
                i = j + 1;
                continue;
            }
        } else if b.get(i) == Some(&b'.') {
            // a field, not the end of a sentence
            if let Some(j) = ident(i + 1).filter(|&j| b[i + 1].is_ascii_lowercase() && j > i + 1) {
                i = j;
                continue;
            }
        }
        return i;
    }
}

// One name in Rust terms, or None to keep it. `name` is a whole name as
// name_len cut it; its longest leading part that a table knows is
// rewritten (with `[]` standing for any index) and the rest kept.
fn rename(name: &str, tables: &[Renames], pool_fields: bool) -> Option<String> {
    // Cut points: after the head and after each [i] / .field part.
    let mut cuts = Vec::new();
    let head_end = name.find(['[', '.']).unwrap_or(name.len());
    cuts.push(head_end);
    let mut i = head_end;
    while i < name.len() {
        let next = name[i + 1..]
            .find(['[', '.'])
            .map_or(name.len(), |k| i + 1 + k);
        cuts.push(next);
        i = next;
    }
    for &cut in cuts.iter().rev() {
        let (part, rest) = name.split_at(cut);
        let (pattern, indices) = strip_indices(part);
        for table in tables {
            for &(from, to) in table.iter() {
                let hit = if let Some(prefix) = from.strip_suffix('*') {
                    pattern
                        .strip_prefix(prefix)
                        .filter(|f| !f.is_empty() && !f.contains(['[', '.']))
                        .map(|f| to.replacen('*', f, 1))
                } else {
                    (pattern == from).then(|| to.to_string())
                };
                if let Some(r) = hit {
                    return Some(put_indices(&r, &indices) + rest);
                }
            }
        }
        if pool_fields && POOL_FIELD_NAMES.contains(&pattern.as_str()) {
            let r = POOL_FIELDS
                .iter()
                .find(|(f, _)| *f == pattern)
                .map_or_else(|| format!("PoolOptions::{pattern}"), |(_, t)| t.to_string());
            return Some(put_indices(&r, &indices) + rest);
        }
        if pool_fields {
            if let Some(&(_, t)) = POOL_FIELDS.iter().find(|(f, _)| *f == pattern) {
                return Some(put_indices(t, &indices) + rest);
            }
        }
    }
    None
}

// "groups[1].kind" -> ("groups[].kind", ["1"])
fn strip_indices(s: &str) -> (String, Vec<&str>) {
    let mut pattern = String::new();
    let mut indices = Vec::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let close = open + rest[open..].find(']').unwrap_or(rest.len() - open);
        pattern.push_str(&rest[..=open]);
        indices.push(&rest[open + 1..close.min(rest.len())]);
        rest = &rest[close.min(rest.len())..];
    }
    pattern.push_str(rest);
    (pattern, indices)
}

fn put_indices(s: &str, indices: &[&str]) -> String {
    let mut out = String::new();
    let mut it = indices.iter();
    let mut rest = s;
    while let Some(k) = rest.find("[]") {
        out.push_str(&rest[..=k]);
        out.push_str(it.next().copied().unwrap_or(""));
        rest = &rest[k + 1..];
    }
    out.push_str(rest);
    out
}

fn rewrite(text: &str, extra: Renames, own: Renames, pool_fields: bool) -> String {
    let tables = [extra, own];
    let mut out = String::with_capacity(text.len() + 16);
    let mut i = 0;
    let mut prev: Option<char> = None;
    while i < text.len() {
        let rest = &text[i..];
        let c = rest.chars().next().unwrap();
        // A quoted span is the caller's own text (a path, an endpoint, a
        // salt): copied as it is, so "/data/host_bytes" stays that. An
        // apostrophe after a letter ("pool's") opens nothing.
        if c == '"' || (c == '\'' && !prev.is_some_and(|p| p.is_alphanumeric())) {
            if let Some(end) = closing_quote(&rest[1..], c) {
                out.push_str(&rest[..end + 2]);
                prev = Some(c);
                i += end + 2;
                continue;
            }
        }
        let starts_name = (c.is_ascii_alphabetic() || c == '_')
            && !prev.is_some_and(|p| is_ident(p) || p == '.' || p == '>' || p == ':');
        if !starts_name {
            out.push(c);
            prev = Some(c);
            i += c.len_utf8();
            continue;
        }
        let len = name_len(rest);
        let name = &rest[..len];
        i += len;
        prev = name.chars().last();
        // pkv_* functions named in the text (pkv_seq_append gives ...)
        if let Some(n) = name.starts_with("pkv_").then(|| names_of(name)).flatten() {
            out.push_str(n.op);
            continue;
        }
        match rename(name, &tables, pool_fields) {
            Some(r) => out.push_str(&r),
            None => out.push_str(name),
        }
        // A dtype shown as its number: the DType variant instead.
        if name == "dtype" || name.ends_with("->dtype") || name.ends_with(".dtype") {
            i += dtype_value(&text[i..], &mut out);
        }
    }
    out
}

// Where the quoted span opened by `quote` ends in `s` (the text after the
// opening quote): the first `quote` that ends the text or that a
// delimiter follows (`"dir": ...`, `'endpoint' has ...`). The library
// quotes the caller's string as it is, which may hold the quote itself
// (`"/a"b/host_bytes"`, `'ipc:///tmp/it's/x'`): a quote followed by more
// of the string does not end it.
fn closing_quote(s: &str, quote: char) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = s[from..].find(quote) {
        let at = from + k;
        match s[at + 1..].chars().next() {
            None | Some(':' | ',' | ';' | ')' | ']' | ' ' | '.') => return Some(at),
            Some(_) => from = at + 1,
        }
    }
    // No such quote: the first one, as before.
    s.find(quote)
}

// After a dtype's name: " 1" or " 1 (f32)" becomes " DType::F32".
// Returns the bytes of text consumed.
fn dtype_value(text: &str, out: &mut String) -> usize {
    let Some(digits) = text.strip_prefix(' ') else {
        return 0;
    };
    let n = digits.bytes().take_while(u8::is_ascii_digit).count();
    if n == 0 {
        return 0;
    }
    let Some(d) = digits[..n].parse::<u32>().ok().and_then(DType::from_raw) else {
        return 0;
    };
    let mut used = 1 + n;
    if let Some(paren) = text[used..].strip_prefix(" (") {
        if let Some(close) = paren.find(')') {
            if !paren[..close].contains(' ') {
                used += 2 + close + 1;
            }
        }
    }
    out.push_str(&format!(" DType::{d:?}"));
    used
}

#[cfg(test)]
mod tests {
    use super::rust_message;

    #[test]
    fn only_whole_names_are_rewritten() {
        let m = rust_message(
            "pkv_batch_prepare: num_seqs is 0; max_num_seqs 5, num_seqs_total 3, seqs[1]",
            None,
            &[],
        );
        assert_eq!(
            m,
            "Pool::prepare: seqs.len() is 0; max_num_seqs 5, num_seqs_total 3, seqs[1]"
        );
        // Unknown functions and messages without a function keep their text.
        assert_eq!(
            rust_message("pkv_nope: num_seqs", None, &[]),
            "pkv_nope: num_seqs"
        );
        assert_eq!(rust_message("num_seqs is 0", None, &[]), "num_seqs is 0");
        // The caller's quoted strings are left alone; the names outside them
        // are still rewritten.
        assert_eq!(
            rust_message(
                "pkv_pool_attach_tiers: opts->file_dir '/x/host_bytes/file_dir': no such \
                 directory; the pool's \"num_seqs\" num_seqs",
                None,
                &[],
            ),
            "Pool::attach_tiers: TierOptions::file_dir '/x/host_bytes/file_dir': no such \
             directory; the pool's \"num_seqs\" num_seqs"
        );
        // A quoted string holding the quote character itself stays whole.
        assert_eq!(
            rust_message(
                "pkv_pool_attach_tiers: file_dir \"/a\"b/host_bytes\": cannot create a file there",
                None,
                &[],
            ),
            "Pool::attach_tiers: TierOptions::file_dir \"/a\"b/host_bytes\": cannot create a file there"
        );
        assert_eq!(
            rust_message(
                "pkv_event_publisher_create: endpoint 'ipc:///tmp/it's/opts->endpoint': bad; opts->endpoint",
                None,
                &[],
            ),
            "EventPublisher::new: endpoint 'ipc:///tmp/it's/opts->endpoint': bad; PublisherOptions::endpoint"
        );
        // A caller's override wins; indices are kept.
        assert_eq!(
            rust_message(
                "pkv_pool_create: opts->k_scales[1] = 0; dtype 5 (i64); device_id 3",
                Some("X::y"),
                &[],
            ),
            "X::y: PoolOptions::k_scales[1] = 0; PoolOptions::dtype DType::I64; PoolOptions::device 3"
        );
    }
}
