"""This node's ResourceSlices: what is built, validated, withdrawn and published."""
