"""Token ids for records: one array per document plus a mask of assistant tokens.

A rendered chat is encoded piece by piece (special tokens by id, each message's content by
the BPE), which equals encoding the whole rendered string because the tokenizer splits on
special tokens before pre-tokenizing; `check_encoding` asserts that on a sample. Encoding by
pieces tells us which tokens belong to assistant turns without any offset bookkeeping.
"""

import numpy as np

import tok


def encode_records(tk, records):
    """-> list of (ids int32 array, assistant bool array) per record."""
    texts = []
    for r in records:
        if "messages" in r:
            texts.extend(m["content"] for m in r["messages"])
        else:
            texts.append(r["text"])
    enc = tk.encode_batch(texts, add_special_tokens=False)
    out, k = [], 0
    default_sys = None
    for r in records:
        ids, asst = [tok.BOS_ID], [False]
        if "messages" in r:
            msgs = r["messages"]
            if msgs[0]["role"] != "system":
                if default_sys is None:
                    default_sys = tk.encode(tok.DEFAULT_SYSTEM, add_special_tokens=False).ids
                ids += [tok.ROLE_IDS["system"]] + default_sys + [tok.EOT_ID]
                asst += [False] * (len(default_sys) + 2)
            for m in msgs:
                body = enc[k].ids
                k += 1
                is_a = m["role"] == "assistant"
                ids += [tok.ROLE_IDS[m["role"]]] + body + [tok.EOT_ID]
                asst += [False] + [is_a] * (len(body) + 1)
        else:
            body = enc[k].ids
            k += 1
            ids += body + [tok.EOT_ID]
            asst += [False] * (len(body) + 1)
        out.append((np.asarray(ids, dtype=np.int32), np.asarray(asst, dtype=bool)))
    assert k == len(enc)
    return out


def record_text(r):
    return tok.render(r["messages"]) if "messages" in r else tok.BOS + r["text"] + tok.EOT


def check_encoding(tk, records, docs, n=300):
    for r, (ids, _) in list(zip(records, docs))[:n]:
        whole = tk.encode(record_text(r), add_special_tokens=False).ids
        assert whole == ids.tolist(), "piecewise encoding differs from whole-string encoding"


def pack(docs):
    """Concatenate documents; returns (flat ids int32, start offset of each document)."""
    lens = np.array([len(d[0]) for d in docs], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    flat = np.concatenate([d[0] for d in docs])
    return flat, starts
