"""Data: corpora, tokenizers, token files and batches. Knows nothing of the model.

Its rooms, each imported where it is needed (this file re-exports nothing, so that a
program that only generates imports no reader of files or datasets):

    shared.py         DataError, and the mark that ends a document
    tokenizer.py      char and byte-level BPE tokenizers (Hugging Face tokenizers)
    config.py         DataConfig: the data: section of a run config
    readers.py        reading .jsonl and Parquet files and hub datasets, as streams
    text.py           text sources: the built-in Shakespeare, the lesson's copies, files, hf: datasets
    conversations.py  conversation sources: .jsonl, Parquet, hf: datasets; each record checked
    template.py       chat templates in Jinja's sandbox: a conversation -> ids, the assistant's flags
    tool_calls.py     tool calls in what an assistant writes: found, compared, read back as a message
    prepare.py        token files, made once and cached: one preparation skeleton for every kind
                      of job (jobs/ says what each kind writes, and reads its folders back)
    batches.py        training batches: random windows, or conversations in epochs (packed or not)
    shakespeare.py, copies.py, tasks.py, token_text.py: the built-in corpora, and tokens as text

It knows no kind of job: jobs/ is where a text and conversations differ.
"""
