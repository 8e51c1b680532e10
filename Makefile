# Entry points for what is not a Python command. The image: see deployments/README.md, "Image".
.PHONY: image
image: ## build/flexmig-image.tar, the OCI image the chart pulls by default (needs root)
	deployments/image/build.sh -o build/flexmig-image.tar
