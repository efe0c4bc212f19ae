"""BERT as the paper has it (Devlin et al. 2019): config and presets (config.py), the encoder with its masked-LM and
next-sentence heads (model.py), the fine-tuning heads (heads.py), and the conversion to and from transformers'
BERT classes (hf_conversion.py: names and configs; hf_files.py: checkpoint directories)."""
