"""A model's tokenizer is shared by every thread that scores with it (a searcher's pool): query and document
batches tokenized at the same time must each keep their own length limit."""
from __future__ import annotations

import threading

import pytest

from pyserini_mores.models import load_model


@pytest.mark.parametrize("model_type", ["maxsim", "cross-encoder", "prettr", "mores"])
def test_queries_and_documents_tokenized_on_two_threads_keep_their_own_lengths(tiny_maxsim_dir, model_type):
    model = load_model(model_type, "minilm") if model_type != "maxsim" else load_model("maxsim", tiny_maxsim_dir)
    documents, query = ["word " * 300] * 4, ["a query " * 40]
    expected = model.tokenize_documents(documents)["input_ids"].shape[1]
    lengths, start = [], threading.Barrier(2)

    def tokenize_documents():
        start.wait()
        lengths.extend(model.tokenize_documents(documents)["input_ids"].shape[1] for _ in range(300))

    def tokenize_queries():
        start.wait()
        for _ in range(300):
            model.tokenize_queries(query)

    threads = [threading.Thread(target=tokenize_documents), threading.Thread(target=tokenize_queries)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert lengths == [expected] * 300
