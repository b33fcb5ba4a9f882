package pagedkv

import (
	"regexp"
	"strings"
)

// The library's messages name its C arguments and option fields
// ("opts->block_size 2000 is outside [1, 1024]", "k_scales[0] = -1 ...",
// "groups[1].sliding_window ..."). goNames rewrites them into the names the
// Go API gives them (PoolOptions.BlockSize, k[0], groups[1].SlidingWindow),
// per C function, so that an error says what to change in the Go call.

// optionFields maps a C options struct's fields to the Go struct's, for
// the C functions taking it as opts (or options).
var (
	poolFields = map[string]string{
		"block_size": "BlockSize", "num_blocks": "NumBlocks",
		// enable_prefix_caching stays as it is: the Go field, DisablePrefixCaching,
		// is its negation, so a value quoted with it would read inverted.
		"memory_budget_bytes": "MemoryBudgetBytes", "hash_algo": "HashAlgo", "hash_seed": "HashSeed",
		"sliding_window": "SlidingWindow", "enable_events": "EnableEvents",
		"max_events": "MaxEvents", "num_layers": "NumLayers", "num_kv_heads": "NumKVHeads",
		"head_dim": "HeadDim", "dtype": "DType", "device_type": "Device", "device_id": "DeviceID",
		"num_threads": "NumThreads", "strict_key_domains": "StrictKeyDomains/VLLMTaggedKeys",
		"kv_scale_granularity": "KVScaleGranularity", "num_kv_scales": "len(KScales)",
		"k_scales": "KScales", "v_scales": "VScales", "enable_partial_reuse": "EnablePartialReuse",
		"enable_retention": "EnableRetention", "max_pinned_blocks": "MaxPinnedBlocks",
		"kv_layout": "KVLayout", "kv_lora_rank": "KVLoRARank", "qk_rope_head_dim": "QKRopeHeadDim",
	}
	groupFields = map[string]string{
		"kind": "Kind", "num_layers": "NumLayers", "num_kv_heads": "NumKVHeads", "head_dim": "HeadDim",
		"sliding_window": "SlidingWindow", "kv_lora_rank": "KVLoraRank", "rope_dim": "RopeDim",
		"state_bytes": "StateBytes", "dtype": "DType", "layer_ids": "LayerIDs",
		"flags": "SnapshotEveryBlock",
	}
	seqFields = map[string]string{
		"priority": "Priority", "lora_id": "LoraID", "lora_name": "LoraName", "lora_path": "LoraPath",
		"cache_salt": "CacheSalt", "mm_items": "MMItems", "num_mm_items": "len(MMItems)",
	}
	hashFields = map[string]string{
		"algo": "Algo", "block_size": "BlockSize", "seed": "Seed", "lora_id": "LoraID",
		"lora_name": "LoraName", "lora_path": "LoraPath", "cache_salt": "CacheSalt",
		"mm_items": "MMItems", "num_mm_items": "len(MMItems)",
		"strict_key_domains": "StrictKeyDomains/VLLMTaggedKeys",
	}
	tierFields = map[string]string{
		"host_bytes": "HostBytes", "file_dir": "FileDir", "file_bytes": "FileBytes",
	}
	transferFields = map[string]string{
		"transports": "Transports", "timeout_ms": "TimeoutMs", "export_ttl_ms": "ExportTTLMs",
	}
	publisherFields = map[string]string{
		"topic": "Topic", "data_parallel_rank": "DataParallelRank", "buffer_steps": "BufferSteps",
		"hwm": "HWM", "event_encoding": "EventEncoding", "hash_encoding": "HashEncoding",
		"device_medium": "DeviceMedium",
	}
	mmItemFields = map[string]string{"offset": "Offset", "length": "Length", "hash": "Hash"}
	rangeFields  = map[string]string{
		"token_begin": "Begin", "token_end": "End", "priority": "Priority",
		"duration_ns": "DurationNs",
	}
)

// kernelNames: the kernel calls' arguments, and the calls their messages
// point to (an MHA call on an MLA pool, and back).
var kernelNames = map[string]string{
	"q_latent": "qLatent", "q_pe": "qPe", "kv_c": "kvC", "k_pe": "kPe",
	"pkv_cache_write": "Batch.CacheWrite", "pkv_attention_forward": "Batch.Attention",
	"pkv_mla_cache_write": "Batch.MLACacheWrite", "pkv_mla_attention": "Batch.MLAAttention",
	"pkv_batch_commit": "Batch.Commit", "kv_layout": "KVLayout",
}

// opNames: per C function, the Go struct its opts are (with its fields)
// and the plain argument names to rewrite.
type opNames struct {
	optsStruct string
	optsFields map[string]string
	args       map[string]string
}

var seqOpNames = &opNames{"SeqOptions", seqFields, nil}

// The counts of the sequence calls' slices and the Go names of their
// integer arguments.
var (
	tokenArgs = map[string]string{"num_tokens": "len(tokens)", "num_hashes": "len(hashes)"}
	admitArgs = map[string]string{"num_tokens": "len(tokens)", "num_hashes": "len(hashes)",
		"num_lookahead": "lookahead"}
	admitOpNames = &opNames{"SeqOptions", seqFields, admitArgs}
	matchOpNames = &opNames{"", nil, tokenArgs}
	countArgs    = map[string]string{"num_tokens": "numTokens", "num_lookahead": "lookahead"}
	seqsArgs     = map[string]string{"num_seqs": "len(seqs)"}
	paramFields  = map[string]string{"softmax_scale": "SoftmaxScale", "sliding_window": "SlidingWindow",
		"logit_softcap": "LogitSoftcap"}
)

var namesByOp = map[string]*opNames{
	"pkv_pool_create": {"PoolOptions", poolFields, nil},
	// base-> is the PoolOptions given to NewGroupPool.
	"pkv_pool_create_groups": {"PoolOptions", poolFields, map[string]string{"num_groups": "len(groups)",
		"enable_partial_reuse": "PoolOptions.EnablePartialReuse", "enable_retention": "PoolOptions.EnableRetention"}},
	"pkv_seq_create":                     seqOpNames,
	"pkv_seq_admit":                      admitOpNames,
	"pkv_seq_admit_hashes":               admitOpNames,
	"pkv_seq_admit_tiered":               admitOpNames,
	"pkv_transfer_import":                seqOpNames,
	"pkv_seq_append":                     {"", nil, map[string]string{"num_tokens": "len(tokens)", "num_lookahead": "lookahead"}},
	"pkv_seq_blocks_needed":              {"", nil, countArgs},
	"pkv_seq_truncate":                   {"", nil, countArgs},
	"pkv_seq_reserve":                    {"", nil, countArgs},
	"pkv_seq_match_prefix":               matchOpNames,
	"pkv_seq_match_prefix_hashes":        matchOpNames,
	"pkv_seq_match_prefix_tiered":        matchOpNames,
	"pkv_seq_match_prefix_hashes_tiered": matchOpNames,
	"pkv_seq_match_prefix_partial": {"", nil, map[string]string{"num_tokens": "len(tokens)",
		"enable_partial_reuse": "PoolOptions.EnablePartialReuse"}},
	"pkv_seq_append_batch": {"", nil, seqsArgs},
	"pkv_seq_free_batch":   {"", nil, seqsArgs},
	"pkv_pool_copy_blocks": {"", nil, map[string]string{"num_pairs": "len(src)"}},
	"pkv_hash_prefix":      {"HashOptions", hashFields, nil},
	"pkv_pool_attach_tiers": {"TierOptions", tierFields,
		map[string]string{"file_dir": "TierOptions.FileDir", "host_bytes": "TierOptions.HostBytes"}},
	"pkv_transfer_engine_create": {"TransferOptions", transferFields, nil},
	"pkv_event_publisher_create": {"PublisherOptions", publisherFields,
		map[string]string{"replay_endpoint": "replayEndpoint", "enable_events": "PoolOptions.EnableEvents"}},
	"pkv_pool_set_kv_scales": {"", nil, map[string]string{"k_scales": "k", "v_scales": "v",
		"num_scales": "len(k)", "num_layers": "NumLayers", "num_kv_heads": "NumKVHeads"}},
	"pkv_seq_set_retention": {"", nil, map[string]string{"num_ranges": "len(ranges)",
		"token_begin": "Begin", "token_end": "End",
		"enable_retention": "PoolOptions.EnableRetention", "max_pinned_blocks": "PoolOptions.MaxPinnedBlocks"}},
	"pkv_mla_cache_write":   {"", nil, kernelNames},
	"pkv_mla_attention":     {"AttentionParams", paramFields, kernelNames},
	"pkv_cache_write":       {"", nil, kernelNames},
	"pkv_attention_forward": {"AttentionParams", paramFields, kernelNames},
	"pkv_batch_prepare":     {"", nil, map[string]string{"query_counts": "queryCounts", "num_seqs": "len(seqs)"}},
	"pkv_batch_prepare_ex":  {"", nil, map[string]string{"query_counts": "queryCounts", "num_seqs": "len(seqs)"}},
	"pkv_batch_prepare_decode": {"", nil, map[string]string{"num_seqs": "len(seqs)",
		"query_counts": "queryCounts", "pkv_batch_prepare": "Pool.Prepare"}},
}

var (
	// opts->field, opts->field[i], opts->field[i].sub (base->: the base
	// options of pkv_pool_create_groups; params->: the attention params)
	optsRef = regexp.MustCompile(`\b(?:opts|options|base|params)->([a-z_0-9]+)((?:\[\d+\])?)(?:\.([a-z_]+))?`)
	// groups[i].field
	groupRef = regexp.MustCompile(`\bgroups\[(\d+)\]\.([a-z_]+)`)
	// ranges[i].field
	rangeRef = regexp.MustCompile(`\branges\[(\d+)\]\.([a-z_]+)`)
	// a C identifier with underscores (argument names)
	identRef = regexp.MustCompile(`\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b`)
)

func goNames(op, msg string) string {
	return goNamesWith(namesByOp[op], op, msg)
}

// goNamesWith is goNames with the names n.
func goNamesWith(n *opNames, op, msg string) string {
	if n == nil || msg == "" {
		return msg
	}
	// The caller's strings the message quotes (a tier directory, an
	// endpoint) stay as they are: "/data/file_dir" is a path, not the
	// argument file_dir.
	var b strings.Builder
	at := 0
	for _, q := range quotedSpans(msg) {
		b.WriteString(n.rewrite(op, msg[at:q[0]]))
		b.WriteString(msg[q[0]:q[1]])
		at = q[1]
	}
	b.WriteString(n.rewrite(op, msg[at:]))
	return strings.TrimSpace(b.String())
}

// renameArgs renames the library's argument names in a library error's
// message for a Go call whose names differ from those of the other calls
// sharing its C function (SwapBlocks' buf, SwapBlocksPinned's host).
func renameArgs(err error, op string, args map[string]string) error {
	e, ok := err.(*Error)
	if !ok || e.Op != op {
		return err
	}
	e.Msg = goNamesWith(&opNames{args: args}, op, e.Msg)
	return e
}

// quotedSpans are the [start, end) of the caller's strings msg quotes:
// "..." or '...', the latter opened after no letter or digit (not the
// apostrophe of "pool's"). A span closes at a quote that ends msg or is
// followed by one of :,;)]. or a space, so a quote inside the caller's
// string ("/a\"b/x") does not end it; with no such quote, at the next one.
func quotedSpans(msg string) [][2]int {
	var spans [][2]int
	for i := 0; i < len(msg); i++ {
		c := msg[i]
		if c != '"' && c != '\'' {
			continue
		}
		if c == '\'' && i > 0 && isAlnum(msg[i-1]) {
			continue
		}
		end := closingQuote(msg[i+1:], c)
		if end < 0 {
			continue
		}
		spans = append(spans, [2]int{i, i + 1 + end + 1})
		i += 1 + end
	}
	return spans
}

func closingQuote(s string, quote byte) int {
	for from := 0; ; {
		k := strings.IndexByte(s[from:], quote)
		if k < 0 {
			break
		}
		at := from + k
		if at+1 == len(s) || strings.IndexByte(":,;)]. ", s[at+1]) >= 0 {
			return at
		}
		from = at + 1
	}
	return strings.IndexByte(s, quote)
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// rewrite renames the C names in msg, a part of a message outside quotes.
func (n *opNames) rewrite(op, msg string) string {
	if msg == "" {
		return msg
	}
	if n.optsFields != nil {
		msg = optsRef.ReplaceAllStringFunc(msg, func(m string) string {
			sm := optsRef.FindStringSubmatch(m)
			f, ok := n.optsFields[sm[1]]
			if !ok {
				return m
			}
			out := n.optsStruct + "." + f + sm[2]
			if sm[3] != "" {
				sub, ok := mmItemFields[sm[3]]
				if !ok || sm[1] != "mm_items" {
					sub = sm[3]
				}
				out += "." + sub
			}
			return out
		})
	}
	if op == "pkv_pool_create_groups" {
		msg = groupRef.ReplaceAllStringFunc(msg, func(m string) string {
			sm := groupRef.FindStringSubmatch(m)
			if f, ok := groupFields[sm[2]]; ok {
				return "groups[" + sm[1] + "]." + f
			}
			return m
		})
	}
	if op == "pkv_seq_set_retention" {
		msg = rangeRef.ReplaceAllStringFunc(msg, func(m string) string {
			sm := rangeRef.FindStringSubmatch(m)
			if f, ok := rangeFields[sm[2]]; ok {
				return "ranges[" + sm[1] + "]." + f
			}
			return m
		})
	}
	if n.args != nil {
		msg = identRef.ReplaceAllStringFunc(msg, func(m string) string {
			if g, ok := n.args[m]; ok {
				return g
			}
			return m
		})
	}
	return msg
}
