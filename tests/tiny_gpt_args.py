"""The command-line options of the tests' tiny GPT (2 layers, 32 wide, GQA, on the mock corpus, seq 16)."""

TINY_GPT_ARGS = [
    "--data.mock=true",
    "--data.seq_length=16",
    "--model.hidden_size=32",
    "--model.num_layers=2",
    "--model.num_attention_heads=4",
    "--model.num_query_groups=2",
    "--model.ffn_hidden_size=64",
]
