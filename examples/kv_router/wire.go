package main

// Decoding vLLM's KV event batches (vllm/distributed/kv_events.py) the way
// routers written for vLLM do: the batch is an array [ts, events,
// data_parallel_rank]; each event is a tagged map {"type": "BlockStored",
// ...} (current vLLM) or a tagged array ["BlockStored", ...] (vLLM <= 0.23);
// block hashes are uint64 (vLLM's default) or bytes.

import (
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

type kvEvent struct {
	kind   string // BlockStored, BlockRemoved, AllBlocksCleared
	hashes []uint64
	parent *uint64
	tokens []int64
	bsize  int64
	medium string
	loraID *int64
}

type kvBatch struct {
	ts     float64
	events []kvEvent
	dpRank int64
}

// Field order of the array form, after the tag (msgspec array_like).
var arrayFields = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

func asInt(v interface{}) (int64, bool) {
	switch x := v.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		return int64(x), true
	}
	return 0, false
}

// asHash: an int hash as it is; a bytes hash by its last 8 bytes, as
// vLLM's maybe_convert_block_hash would make it an int.
func asHash(v interface{}) (uint64, error) {
	switch x := v.(type) {
	case []byte:
		if len(x) < 8 {
			return 0, fmt.Errorf("block hash of %d bytes", len(x))
		}
		return binary.BigEndian.Uint64(x[len(x)-8:]), nil
	case uint64:
		return x, nil
	}
	if i, ok := asInt(v); ok {
		return uint64(i), nil
	}
	return 0, fmt.Errorf("block hash of type %T", v)
}

func decodeBatch(payload []byte) (kvBatch, error) {
	var raw []interface{}
	var b kvBatch
	if err := msgpack.Unmarshal(payload, &raw); err != nil {
		return b, err
	}
	if len(raw) < 2 {
		return b, fmt.Errorf("batch of %d fields", len(raw))
	}
	ts, ok := raw[0].(float64)
	if !ok {
		return b, fmt.Errorf("ts of type %T", raw[0])
	}
	b.ts = ts
	if len(raw) > 2 {
		b.dpRank, _ = asInt(raw[2])
	}
	evs, ok := raw[1].([]interface{})
	if !ok {
		return b, fmt.Errorf("events of type %T", raw[1])
	}
	for _, e := range evs {
		fields := map[string]interface{}{}
		switch x := e.(type) {
		case map[string]interface{}:
			fields = x
		case []interface{}:
			if len(x) == 0 {
				return b, fmt.Errorf("empty event")
			}
			tag, _ := x[0].(string)
			fields["type"] = tag
			for i, name := range arrayFields[tag] {
				if i+1 < len(x) {
					fields[name] = x[i+1]
				}
			}
		default:
			return b, fmt.Errorf("event of type %T", e)
		}
		ev := kvEvent{}
		ev.kind, _ = fields["type"].(string)
		if hs, ok := fields["block_hashes"].([]interface{}); ok {
			for _, h := range hs {
				v, err := asHash(h)
				if err != nil {
					return b, err
				}
				ev.hashes = append(ev.hashes, v)
			}
		}
		if p := fields["parent_block_hash"]; p != nil {
			v, err := asHash(p)
			if err != nil {
				return b, err
			}
			ev.parent = &v
		}
		if ts, ok := fields["token_ids"].([]interface{}); ok {
			for _, t := range ts {
				v, _ := asInt(t)
				ev.tokens = append(ev.tokens, v)
			}
		}
		ev.bsize, _ = asInt(fields["block_size"])
		ev.medium, _ = fields["medium"].(string)
		if l, ok := asInt(fields["lora_id"]); ok {
			ev.loraID = &l
		}
		switch ev.kind {
		case "BlockStored", "BlockRemoved", "AllBlocksCleared":
		default:
			return b, fmt.Errorf("unknown event %q", ev.kind)
		}
		b.events = append(b.events, ev)
	}
	return b, nil
}
